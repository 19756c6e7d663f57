// DistIR chart: draws the plotly figure that Python put in the model's state, sized to
// its container, and reports clicks and x-axis zooms. plotly.js comes from the shared
// library model (one per kernel) and is evaluated once per page.

const REF = "IPY_MODEL_";
const LIBRARY = Symbol.for("distir.plotly");

function plotly(model) {
  const cache = (globalThis[LIBRARY] ||= new Map());
  const ref = model.get("library") || "";
  if (!cache.has(ref)) {
    const loading = (async () => {
      const library = await model.widget_manager.get_model(ref.slice(REF.length));
      const text = library.get("source") || (await asked(library));
      // plotly.min.js is a UMD bundle: give it a CommonJS `module` to fill
      const source =
        "const module = { exports: {} };\n" + text + "\nexport default module.exports;\n";
      const url = URL.createObjectURL(new Blob([source], { type: "text/javascript" }));
      try {
        return (await import(/* webpackIgnore: true */ url)).default;
      } finally {
        URL.revokeObjectURL(url);
      }
    })();
    loading.catch(() => cache.delete(ref));
    cache.set(ref, loading);
  }
  return cache.get(ref);
}

// The library's source rides only in the message that opened its model: a page that
// restored the model later (a reload, a second tab) asks the kernel for it.
function asked(library) {
  return new Promise((resolve) => {
    const take = (content, buffers) => {
      if (!content || content["plotly.js"] !== library.get("version")) return;
      if (!buffers || !buffers.length) return;
      library.off("msg:custom", take);
      resolve(new TextDecoder().decode(buffers[0]));
    };
    library.on("msg:custom", take);
    library.send({ want: "plotly.js" });
  });
}

function ints(spec) {
  const bytes = Uint8Array.from(atob(spec.bdata), (c) => c.charCodeAt(0));
  return new Int32Array(bytes.buffer);
}

// String tables ({strings, index}) expand to arrays; typed-array specs plotly reads itself.
function expand(node) {
  if (Array.isArray(node)) return node.map(expand);
  if (node && typeof node === "object") {
    if (Array.isArray(node.strings) && node.index) {
      return Array.from(ints(node.index), (i) => node.strings[i]);
    }
    const out = {};
    for (const key of Object.keys(node)) out[key] = expand(node[key]);
    return out;
  }
  return node;
}

const STYLE = `
.distir-chart { width: 100%; position: relative; contain: content; }
.distir-chart .distir-chart-wait { color: #666; font: 12px sans-serif; padding: 8px; }
`;

async function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "distir-chart";
  const style = document.createElement("style");
  style.textContent = STYLE;
  const wait = document.createElement("div");
  wait.className = "distir-chart-wait";
  wait.textContent = "drawing the chart…";
  const plot = document.createElement("div");
  root.append(style, wait, plot);
  el.appendChild(root);

  let alive = true;
  let Plotly = null;
  let queue = Promise.resolve();
  let hooked = false;
  let clicks = 0;
  let zooms = 0;
  let lastWidth = 0;

  const hook = () => {
    if (hooked) return;
    hooked = true;
    plot.on("plotly_click", (event) => {
      const p = event && event.points && event.points[0];
      if (!p) return;
      clicks += 1;
      model.set("clicked", { trace: p.curveNumber, point: p.pointNumber, n: clicks });
      model.save_changes();
    });
    plot.on("plotly_relayout", (event) => {
      if (!event) return;
      let zoom = null;
      if (event["xaxis.autorange"]) zoom = { autorange: true };
      else if ("xaxis.range[0]" in event && "xaxis.range[1]" in event) {
        zoom = { range: [event["xaxis.range[0]"], event["xaxis.range[1]"]] };
      } else if (Array.isArray(event["xaxis.range"])) zoom = { range: event["xaxis.range"] };
      if (!zoom) return;
      zooms += 1;
      model.set("zoomed", { ...zoom, n: zooms });
      model.save_changes();
    });
  };

  // Draw the latest figure once plotly.js is loaded and the chart has a width; each
  // revision asks again (a figure equal to the last one sends no change of its own).
  let wanted = true;
  const draw = () => {
    wanted = true;
    el.dataset.receivedAt = String(performance.now()); // for benchmarks: arrival to paint
    queue = queue.then(async () => {
      if (!alive || !Plotly || !wanted) return;
      const width = root.clientWidth;
      if (width === 0) return; // not laid out yet: the resize observer draws it
      wanted = false;
      const figure = model.get("figure") || {};
      const layout = { ...expand(figure.layout || {}), template: model.get("template") };
      delete layout.width; // the container's width: the chart follows the page
      layout.autosize = true;
      // autosize reads the box's height too: the figure's, or plotly's default
      plot.style.height = `${layout.height || 450}px`;
      const revision = model.get("revision");
      await Plotly.react(plot, expand(figure.data || []), layout, model.get("config"));
      lastWidth = width;
      wait.remove();
      hook();
      el.dataset.revision = String(revision);
      el.dataset.drawnAt = String(performance.now());
      if (model.get("drawn") !== revision) {
        model.set("drawn", revision);
        model.save_changes();
      }
    }).catch((error) => {
      wait.textContent = `the chart could not be drawn: ${error}`;
      root.prepend(wait);
      console.error("[distir] chart", error);
    });
  };

  const resized = () => {
    const width = root.clientWidth;
    if (!Plotly || width === 0) return;
    if (wanted) return draw();
    if (width === lastWidth) return;
    lastWidth = width;
    queue = queue.then(() => alive && Plotly.Plots.resize(plot)).catch(() => {});
  };
  const observer = new ResizeObserver(resized);
  observer.observe(root);
  model.on("change:revision", draw);
  model.on("change:config", draw);

  Plotly = await plotly(model);
  draw();

  return () => {
    alive = false;
    observer.disconnect();
    model.off("change:revision", draw);
    model.off("change:config", draw);
    if (Plotly) Plotly.purge(plot);
  };
}

export default { render };
