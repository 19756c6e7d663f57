"""The graph view's pure half: Function -> graphviz dot -> SVG plus an id map.

Every op gets a stable id from its index path (``op-3``, ``op-3.1`` for op 1 of
the body of pmap op 3); values are named as the printer names them. The SVG
keeps these ids on its ``<g>`` elements and :attr:`RenderedGraph.id_map` says
what each one is, so a click in the browser reports an id and Python looks up
the op or value. Nothing here needs a browser or a kernel.

>>> from ir import FunctionBuilder, TensorType
>>> b = FunctionBuilder("f")
>>> x = b.input("x", TensorType((8, 4), device=0))
>>> g = render_graph(b.finish(b.call("Relu", x, name="y")))
>>> g.id_map["op-0"], sorted(set(g.id_map.values()))[-1]
(('op', '0'), ('value', 'y'))
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from ir.function import Function
from ir.op import Op
from ir.transforms import inline_tasks
from ir.value import Value

from .drawing import Drawing
from .ids import op_id, op_paths, shape_label, value_names
from .legend import LegendEntry, legend_html
from .logical import LogicalDrawing
from .svg import DotJob, postprocess_svg

if TYPE_CHECKING:
    from ir.sim.result import SimResult


@dataclass(frozen=True)
class GraphOptions:
    """How to draw a Function.

    ``max_ops``: above this many ops (pmap bodies counted), repeated layers fold
    into summary nodes and pmap bodies with more than ``max_body_ops`` visible
    ops fold into one node; ``None`` never folds. ``expanded`` lists summary
    node ids (``group-...`` or a pmap's ``op-...``) the user opened.
    ``max_edge_ranks``: in drawings of more than ``stub_above_nodes`` nodes, an
    edge spanning more ranks starts at a small stub node (``↪ name``) next to its
    reader instead of crossing the graph; ``None`` draws every edge whole. A fold
    reading ``shared_stub_from`` or more far values gets one shared stub for them.
    Above ``bound_above_nodes`` nodes, dot's network simplex runs a bounded number
    of iterations (``nslimit``), trading a little compaction for time.
    ``view``: ``"unrolled"`` draws each pmap's body op by op (per device, for small
    programs); ``"logical"`` draws one node per logical op (see :mod:`widgets.logical`),
    folding runs of ops on the same devices above ``max_ops`` top-level ops.
    """

    max_ops: int | None = 80
    max_body_ops: int = 40
    min_repeats: int = 3
    expanded: frozenset[str] = frozenset()
    rankdir: str = "TB"
    max_edge_ranks: int | None = 8
    stub_above_nodes: int = 60
    bound_above_nodes: int = 300
    shared_stub_from: int = 4
    view: str = "unrolled"


@dataclass(frozen=True)
class RenderedGraph:
    """The dot source, the SVG, and what each clickable SVG id stands for.

    ``id_map[svg_id]`` is ``("op", path)``, ``("value", name)`` or
    ``("group", group_id)``. ``groups[group_id]`` lists the op ids a summary
    node hides. ``ops[path]`` and ``values[name]`` give the IR objects back.
    """

    dot: str
    svg: str
    id_map: Mapping[str, tuple[str, str]]
    legend: tuple[LegendEntry, ...]
    groups: Mapping[str, tuple[str, ...]]
    ops: Mapping[str, Op] = field(repr=False)
    values: Mapping[str, Value] = field(repr=False)

    def hidden_in(self, svg_id: str) -> str | None:
        """The summary node that hides op ``svg_id``, or None if it is visible."""
        for group, members in self.groups.items():
            if svg_id in members:
                return group
        return None

    def _repr_html_(self) -> str:
        return legend_html(self.legend) + self.svg


def render_graph(
    function: Function,
    placements: Mapping[Value | str, str] | None = None,
    options: GraphOptions | None = None,
    *,
    dot_binary: str = "dot",
    result: SimResult | None = None,
) -> RenderedGraph:
    """Draw ``function``: dot source, SVG (via the ``dot`` binary) and the id map.

    ``placements`` maps values (or their names) to a placement label such as
    ``S(0) R``, shown under the shape on the value's edges.
    """
    return start_render(
        function, placements, options, dot_binary=dot_binary, result=result
    ).result()


def start_render(
    function: Function,
    placements: Mapping[Value | str, str] | None = None,
    options: GraphOptions | None = None,
    *,
    dot_binary: str = "dot",
    result: SimResult | None = None,
) -> PendingGraph:
    """:func:`render_graph` in two halves: the dot source now, graphviz's layout running
    in its own process until :meth:`PendingGraph.result` collects it. ``result`` (the
    logical view only) puts simulated times on collectives."""
    options = options or GraphOptions()
    drawing: Drawing | LogicalDrawing
    # a task's ops drawn in its place (T.megatron(tasks=True) writes repeated tasks once)
    flat = inline_tasks(function)
    if options.view == "logical":
        drawing = LogicalDrawing(flat, placements or {}, options, result)
    elif options.view == "unrolled":
        drawing = Drawing(flat, placements or {}, options)
    else:
        raise ValueError(f"GraphOptions.view is {options.view!r}: use 'logical' or 'unrolled'")
    dot = drawing.dot()
    return PendingGraph(drawing, dot, DotJob(dot, dot_binary=dot_binary))


class PendingGraph:
    """A drawing whose layout graphviz is computing; :meth:`result` waits for it."""

    def __init__(self, drawing: Drawing | LogicalDrawing, dot: str, job: DotJob) -> None:
        self._drawing, self._dot, self._job = drawing, dot, job

    def result(self) -> RenderedGraph:
        """The finished :class:`RenderedGraph` (raises GraphvizError if ``dot`` failed)."""
        drawing = self._drawing
        return RenderedGraph(
            dot=self._dot,
            svg=postprocess_svg(self._job.svg(), drawing.tooltips),
            id_map=MappingProxyType(drawing.id_map),
            legend=drawing.legend(),
            groups=MappingProxyType(drawing.groups),
            ops=MappingProxyType({p: op for op, p in drawing.paths.items()}),
            values=MappingProxyType({n: v for v, n in drawing.names.items()}),
        )


class Drawn:
    """A drawing made before, shown as a :class:`PendingGraph` is (``result()``)."""

    def __init__(self, rendered: RenderedGraph) -> None:
        self._rendered = rendered

    def result(self) -> RenderedGraph:
        return self._rendered


__all__ = [
    "Drawn",
    "GraphOptions",
    "LegendEntry",
    "PendingGraph",
    "RenderedGraph",
    "legend_html",
    "op_id",
    "op_paths",
    "render_graph",
    "shape_label",
    "start_render",
    "value_names",
]
