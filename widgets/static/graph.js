// DistIR graph view: shows the SVG that Python drew, zooms and pans it, and
// reports clicks. All decisions (what an id means, what to select) are in Python.

const STYLE = `
.distir-gv { font: 12px sans-serif; }
.distir-gv .bar button { margin-right: 4px; min-width: 28px; }
.distir-gv .port { overflow: hidden; border: 1px solid #ccc; position: relative; contain: strict;
  cursor: grab; background: #fff; }
.distir-gv .port.dragging { cursor: grabbing; }
.distir-gv .stage { transform-origin: 0 0; position: absolute; left: 0; top: 0; }
.distir-gv g.node, .distir-gv g.edge, .distir-gv g.cluster { cursor: pointer; }
.distir-gv g.edge:hover path:not(.hit) { stroke-width: 2.5; }
.distir-gv .sel polygon, .distir-gv .sel ellipse, .distir-gv .sel path:not(.hit) {
  stroke: #ff00aa !important; stroke-width: 3 !important; }
.distir-gv .err { color: #b2182b; white-space: pre-wrap; }
`;

function button(label, title, onClick) {
  const b = document.createElement("button");
  b.textContent = label;
  b.title = title;
  b.addEventListener("click", onClick);
  return b;
}

function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "distir-gv";
  const style = document.createElement("style");
  style.textContent = STYLE;
  const legend = document.createElement("div");
  const bar = document.createElement("div");
  bar.className = "bar";
  const err = document.createElement("div");
  err.className = "err";
  const port = document.createElement("div");
  port.className = "port";
  const stage = document.createElement("div");
  stage.className = "stage";
  port.appendChild(stage);
  root.append(style, legend, bar, err, port);
  el.appendChild(root);

  let view = { x: 0, y: 0, k: 1 };
  let moved = false; // the user zoomed or panned: keep their view across redraws
  const apply = () => {
    stage.style.transform = `translate(${view.x}px, ${view.y}px) scale(${view.k})`;
  };
  const zoomAt = (factor, cx, cy) => {
    moved = true;
    const k = Math.min(20, Math.max(0.05, view.k * factor));
    view = { x: cx - ((cx - view.x) * k) / view.k, y: cy - ((cy - view.y) * k) / view.k, k };
    apply();
  };
  // fit the graph to the panel's width (whole: and height), from its top (the default);
  // fitting the width stops at a scale whose text can still be read (a wide graph, e.g.
  // eight replicas side by side, then shows its left part: drag or "fit" for the rest)
  const READABLE = 0.2;
  const fitter = (whole) => () => {
    const svg = stage.querySelector("svg");
    if (!svg) return;
    const w = svg.width.baseVal.value || 1;
    const h = svg.height.baseVal.value || 1;
    let k = Math.min(port.clientWidth / w, whole ? port.clientHeight / h : 1, 1);
    if (!whole) k = Math.max(k, READABLE);
    view = { x: Math.max(0, (port.clientWidth - w * k) / 2), y: 0, k };
    apply();
  };
  const fit = fitter(true);
  const fitWidth = fitter(false);
  bar.append(
    button("+", "zoom in", () => zoomAt(1.25, port.clientWidth / 2, port.clientHeight / 2)),
    button("−", "zoom out", () => zoomAt(0.8, port.clientWidth / 2, port.clientHeight / 2)),
    button("width", "fit the graph to the panel's width", () => { moved = false; fitWidth(); }),
    button("fit", "fit the whole graph into the view", () => { moved = true; fit(); }),
  );

  const highlight = () => {
    stage.querySelectorAll(".sel").forEach((n) => n.classList.remove("sel"));
    const ids = new Set((model.get("selected") || {}).ids || []);
    stage.querySelectorAll("g[id]").forEach((g) => {
      if (ids.has(g.id)) g.classList.add("sel");
    });
  };
  const draw = () => {
    port.style.height = `${model.get("height_px")}px`;
    legend.innerHTML = model.get("legend_html");
    stage.innerHTML = model.get("svg");
    err.textContent = model.get("error");
    highlight();
    // a new drawing fits the panel's width, unless the user has moved the view
    if (!moved && stage.querySelector("svg")) requestAnimationFrame(fitWidth);
  };

  let drag = null;
  let clicks = 0;
  port.addEventListener("wheel", (e) => {
    e.preventDefault();
    const r = port.getBoundingClientRect();
    zoomAt(e.deltaY < 0 ? 1.15 : 1 / 1.15, e.clientX - r.left, e.clientY - r.top);
  }, { passive: false });
  port.addEventListener("pointerdown", (e) => {
    drag = { x: e.clientX, y: e.clientY, vx: view.x, vy: view.y, moved: false };
  });
  port.addEventListener("pointermove", (e) => {
    if (!drag) return;
    const dx = e.clientX - drag.x;
    const dy = e.clientY - drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 4) {
      drag.moved = true;
      port.classList.add("dragging");
    }
    if (drag.moved) {
      moved = true;
      view = { ...view, x: drag.vx + dx, y: drag.vy + dy };
      apply();
    }
  });
  const stop = (e) => {
    const wasClick = drag && !drag.moved;
    drag = null;
    port.classList.remove("dragging");
    if (!wasClick || e.type !== "pointerup") return;
    const hit = e.target.closest ? e.target.closest("g.node, g.edge, g.cluster") : null;
    if (!hit || !stage.contains(hit)) return;
    clicks += 1;
    model.set("clicked", { id: hit.id, n: clicks });
    model.save_changes();
  };
  port.addEventListener("pointerup", stop);
  port.addEventListener("pointerleave", stop);
  const drawn = ["svg", "legend_html", "error", "height_px"];
  drawn.forEach((name) => model.on(`change:${name}`, draw));
  model.on("change:selected", highlight);
  draw();
  // the panel's width changes with the window: refit, unless the user has moved the view
  let width = 0;
  const resized = new ResizeObserver(() => {
    if (port.clientWidth !== width) {
      width = port.clientWidth;
      if (!moved) fitWidth();
    }
  });
  resized.observe(port);
  return () => {
    resized.disconnect();
    drawn.forEach((name) => model.off(`change:${name}`, draw));
    model.off("change:selected", highlight);
  };
}

export default { render };
