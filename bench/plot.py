"""A small SVG line chart for benchmark results (no plotting library in the lock): panels
stacked over one time axis, each with its series and a legend."""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

WIDTH, PANEL, MARGIN_L, MARGIN_R, TOP, GAP = 900, 190, 70, 150, 40, 40


@dataclass(frozen=True)
class Series:
    label: str
    points: list[tuple[float, float]]
    color: str


def line_chart(title: str, panels: list[tuple[str, list[Series]]], x_label: str) -> str:
    """Panels of (y label, series) over a shared x axis, as one SVG document."""
    xs = [x for _, series in panels for s in series for x, _ in s.points]
    x_max = max(xs, default=1.0) or 1.0
    plot_w = WIDTH - MARGIN_L - MARGIN_R
    height = TOP + len(panels) * (PANEL + GAP) + 20
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
        f'<text x="{WIDTH / 2}" y="22" text-anchor="middle" font-size="15">{escape(title)}</text>',
    ]
    for i, (y_label, series) in enumerate(panels):
        top = TOP + i * (PANEL + GAP)
        ys = [y for s in series for _, y in s.points]
        y_max = _nice(max(ys, default=1.0))

        def px(x: float) -> float:
            return MARGIN_L + plot_w * x / x_max

        def py(y: float, top: float = top, y_max: float = y_max) -> float:
            return top + PANEL - PANEL * y / y_max

        out.append(
            f'<rect x="{MARGIN_L}" y="{top}" width="{plot_w}" height="{PANEL}" '
            f'fill="none" stroke="#999"/>'
        )
        for k in range(5):
            y = y_max * k / 4
            out.append(
                f'<text x="{MARGIN_L - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:g}</text>'
                f'<line x1="{MARGIN_L}" x2="{MARGIN_L + plot_w}" y1="{py(y):.1f}" '
                f'y2="{py(y):.1f}" stroke="#eee"/>'
            )
        out.append(
            f'<text transform="translate(16,{top + PANEL / 2}) rotate(-90)" '
            f'text-anchor="middle">{escape(y_label)}</text>'
        )
        for j, s in enumerate(series):
            path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s.points)
            out.append(
                f'<polyline points="{path}" fill="none" stroke="{s.color}" stroke-width="1.8"/>'
            )
            ly = top + 16 + 18 * j
            out.append(
                f'<line x1="{WIDTH - MARGIN_R + 10}" x2="{WIDTH - MARGIN_R + 30}" y1="{ly - 4}" '
                f'y2="{ly - 4}" stroke="{s.color}" stroke-width="3"/>'
                f'<text x="{WIDTH - MARGIN_R + 36}" y="{ly}">{escape(s.label)}</text>'
            )
    bottom = TOP + len(panels) * (PANEL + GAP) - GAP
    for k in range(7):
        x = x_max * k / 6
        out.append(
            f'<text x="{MARGIN_L + plot_w * k / 6:.1f}" y="{bottom + 16}" '
            f'text-anchor="middle">{x:.0f}</text>'
        )
    out.append(
        f'<text x="{MARGIN_L + plot_w / 2}" y="{bottom + 34}" text-anchor="middle">'
        f"{escape(x_label)}</text></svg>"
    )
    return "\n".join(out) + "\n"


def _nice(value: float) -> float:
    """The round number at or above ``value`` an axis ends at."""
    if value <= 0:
        return 1.0
    step = 10 ** len(str(int(value))) / 10
    for factor in (1, 2, 2.5, 5, 10):
        if value <= step * factor:
            return float(step * factor)
    return value
