// A line plot over time as SVG: every series of one unit, with its points, a legend and
// labelled axes. data-points on the plot says how many points it drew.

import { COLORS, number, svg, el } from "./dom.js";

const W = 440, H = 190, L = 52, R = 12, T = 12, B = 26;

export function linePlot({ id, title, unit, series }) {
  const points = series.flatMap((s) => s.points);
  const figure = el("figure", { class: "plot", id, "data-points": points.length });
  figure.append(el("figcaption", {}, `${title} (${unit})`));
  const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title, class: "chart" });
  figure.append(chart);
  if (points.length < 1) {
    chart.append(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "axis" }, "no data yet"));
    return figure;
  }
  const ts = points.map((p) => p[0]), vs = points.map((p) => p[1]);
  let t0 = Math.min(...ts), t1 = Math.max(...ts);
  if (t1 === t0) { t0 -= 1000; t1 += 1000; }
  const v1 = Math.max(...vs) > 0 ? Math.max(...vs) * 1.1 : 1;
  const x = (t) => L + ((t - t0) / (t1 - t0)) * (W - L - R);
  const y = (v) => H - B - (v / v1) * (H - T - B);
  chart.append(
    svg("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis-line" }),
    svg("line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis-line" }),
    svg("text", { x: L - 4, y: y(v1) + 4, "text-anchor": "end", class: "axis" }, number(v1)),
    svg("text", { x: L - 4, y: y(v1 / 2) + 4, "text-anchor": "end", class: "axis" }, number(v1 / 2)),
    svg("text", { x: L - 4, y: H - B + 4, "text-anchor": "end", class: "axis" }, "0"),
    svg("text", { x: L, y: H - 6, class: "axis" }, clock(t0)),
    svg("text", { x: W - R, y: H - 6, "text-anchor": "end", class: "axis" }, clock(t1)),
  );
  const legend = el("div", { class: "legend" });
  series.forEach((s, i) => {
    const color = COLORS[i % COLORS.length];
    const line = s.points.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ");
    chart.append(svg("polyline", { points: line, fill: "none", stroke: color, "stroke-width": 1.6, class: "series", "data-series": s.name }));
    if (s.points.length <= 80) {
      for (const p of s.points) {
        chart.append(svg("circle", { cx: x(p[0]).toFixed(1), cy: y(p[1]).toFixed(1), r: 2.2, fill: color, class: "point" }));
      }
    }
    const last = s.points.length ? s.points[s.points.length - 1][1] : null;
    legend.append(el("span", { class: "key" }, svg("svg", { width: 10, height: 10 }, svg("rect", { width: 10, height: 10, fill: color })),
      ` ${s.label ?? s.name}${last === null ? "" : ": " + number(last)}`));
  });
  figure.append(legend);
  return figure;
}

function clock(epochMs) {
  return new Date(epochMs).toISOString().slice(11, 19);
}

// [time, value] pairs of a column, without its gaps (null).
export function pairs(times, values) {
  const out = [];
  values.forEach((v, i) => { if (v !== null && v !== undefined) out.push([times[i], v]); });
  return out;
}
