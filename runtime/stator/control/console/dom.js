// Building the page: every value goes in as text (never as HTML), so nothing a driver
// reports can run as code in the console.

const SVG = "http://www.w3.org/2000/svg";

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  return fill(node, attrs, children);
}

export function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  return fill(node, attrs, children);
}

function fill(node, attrs, children) {
  for (const [key, value] of Object.entries(attrs)) {
    if (value !== undefined && value !== null) node.setAttribute(key, String(value));
  }
  for (const child of children) {
    if (child === undefined || child === null) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function rows(table, entries, cells, rowClass) {
  const body = table.tBodies[0];
  body.replaceChildren(
    ...entries.map((entry) => el("tr", { class: rowClass }, ...cells(entry).map((c) => el("td", {}, c ?? "")))),
  );
  if (!entries.length) {
    const span = table.tHead.rows[0].cells.length;
    body.append(el("tr", { class: "empty" }, el("td", { colspan: span }, "none yet")));
  }
}

export function bytes(n) {
  if (n === null || n === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

export function ms(n) {
  if (n === null || n === undefined) return "";
  return n < 1000 ? `${n} ms` : `${(n / 1000).toFixed(1)} s`;
}

export function time(epochMs) {
  if (!epochMs) return "";
  return new Date(epochMs).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

export function number(n) {
  if (n === null || n === undefined) return "";
  if (Math.abs(n) >= 1e6) return `${(n / 1e6).toFixed(1)}M`;
  if (Math.abs(n) >= 1e4) return `${(n / 1e3).toFixed(1)}k`;
  return Number.isInteger(n) ? String(n) : n.toFixed(1);
}

// A palette for series and regions (colours are attributes, not inline styles: CSP).
export const COLORS = ["#2f6fdf", "#e0702a", "#2a9d5b", "#b03aa0", "#c9a400", "#1aa3b8", "#d23c3c", "#6b6b6b"];
