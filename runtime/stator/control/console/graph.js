// The job graph as SVG: nodes in columns by their distance from a source, edges from each
// input to its consumer, nodes coloured by failover region.

import { COLORS, el, svg } from "./dom.js";

const NODE_W = 150, NODE_H = 46, GAP_X = 56, GAP_Y = 18, PAD = 12;

export function jobGraph(graph, regions) {
  const nodes = graph?.nodes ?? [];
  const byId = new Map(nodes.map((n) => [n.id, n]));
  const depth = new Map();
  const depthOf = (n) => {
    if (!depth.has(n.id)) {
      depth.set(n.id, 0); // a cycle cannot happen (a DAG), this only guards the recursion
      depth.set(n.id, n.inputs.length ? 1 + Math.max(...n.inputs.map((i) => depthOf(byId.get(i)))) : 0);
    }
    return depth.get(n.id);
  };
  const columns = [];
  for (const n of nodes) (columns[depthOf(n)] ??= []).push(n);
  const at = new Map();
  columns.forEach((column, c) => column.forEach((n, r) => at.set(n.id, {
    x: PAD + c * (NODE_W + GAP_X), y: PAD + r * (NODE_H + GAP_Y),
  })));
  const rowsMax = Math.max(1, ...columns.map((c) => c.length));
  const width = PAD * 2 + columns.length * NODE_W + Math.max(0, columns.length - 1) * GAP_X;
  const height = PAD * 2 + rowsMax * NODE_H + (rowsMax - 1) * GAP_Y;
  const regionIds = [...new Set(nodes.map((n) => n.region))].sort();
  const color = (n) => COLORS[regionIds.indexOf(n.region) % COLORS.length];

  const chart = svg("svg", {
    id: "graph-svg", viewBox: `0 0 ${width} ${height}`, width, height, role: "img",
    "aria-label": "job graph", "data-nodes": nodes.length,
  });
  chart.append(svg("defs", {}, svg("marker", {
    id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse",
  }, svg("path", { d: "M 0 0 L 10 5 L 0 10 z", class: "arrow" }))));
  for (const n of nodes) {
    for (const i of n.inputs) {
      const a = at.get(i), b = at.get(n.id);
      const x1 = a.x + NODE_W, y1 = a.y + NODE_H / 2, x2 = b.x, y2 = b.y + NODE_H / 2, mid = (x1 + x2) / 2;
      const shuffle = n.key_groups.length > 0;
      chart.append(svg("path", {
        d: `M ${x1} ${y1} C ${mid} ${y1}, ${mid} ${y2}, ${x2} ${y2}`, class: shuffle ? "edge shuffle" : "edge",
        "marker-end": "url(#arrow)", "data-from": byId.get(i).label, "data-to": n.label,
      }));
    }
  }
  for (const n of nodes) {
    const { x, y } = at.get(n.id);
    const detail = n.parallelism ? `${n.kind} ×${n.parallelism}` : n.kind;
    chart.append(svg("g", { class: "node", "data-label": n.label, "data-kind": n.kind, "data-region": n.region },
      svg("rect", { x, y, width: NODE_W, height: NODE_H, rx: 7, fill: "#fff", stroke: color(n), "stroke-width": 2 }),
      svg("rect", { x, y, width: 6, height: NODE_H, rx: 2, fill: color(n) }),
      svg("text", { x: x + 14, y: y + 19, class: "node-label" }, n.label),
      svg("text", { x: x + 14, y: y + 36, class: "node-kind" }, detail),
    ));
  }
  const states = new Map((regions ?? []).map((r) => [r.id, r.state]));
  const legend = el("div", { class: "legend" }, ...regionIds.map((r, i) => el("span", { class: "key" },
    svg("svg", { width: 10, height: 10 }, svg("rect", { width: 10, height: 10, fill: COLORS[i % COLORS.length] })),
    ` region ${r}${states.has(r) ? " (" + states.get(r) + ")" : ""}`)));
  return el("div", { class: "graph" }, chart, legend);
}
