"""The workbench's serving mode, as plain Python: a model, a topology, a request mix and a
serving strategy; what the dashboard's serving panel and the static report show.

A :class:`ServingSession` holds them and answers with ``ir.inference``: the strategy's
metrics (TTFT, TPOT, throughput, memory, the largest batch), the latency/throughput front
over every strategy (on demand: it simulates many programs), and the decode step as the
seeds' annotations: :meth:`ServingSession.annotate` places one value (a weight or a cache)
by hand, propagates the annotations over the decode step, lowers nothing, simulates it and
gives the new TPOT (the RFC's flow; "click a sharding annotation and see TPOT change").
Views are the pure functions of ``widgets.serving`` and ``widgets.gantt``;
:meth:`ServingSession.payload` is what a view draws and :meth:`report_html` the report's
section.

>>> import ir
>>> from ir.inference import RequestMix, ServingStrategy
>>> f = ir.models.llama(1, 512, 256, 8, 1000, 2, kv_heads=4, ffn=512, dtype="bfloat16")
>>> s = ServingSession(f, ir.Topology.preset("a100-hgx", 2), RequestMix(128, 32, 4))
>>> s.set_strategy(tp=2).strategy
ServingStrategy('tp2')
>>> s.annotated().tpot_s == s.metrics.tpot_s or s.annotated().tpot_s > 0
True
"""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ir import interrupt
from ir.device import Topology
from ir.function import Function
from ir.hardware import CUDA_GRAPH_HOST, with_host
from ir.inference import (
    RequestMix,
    ServingError,
    ServingFront,
    ServingMetrics,
    ServingStrategy,
    decode_step,
    serving_annotations,
    serving_front,
    serving_metrics,
    strategies,
)
from ir.models_llama import llama_preset
from ir.sharding import propagate
from ir.sharding.annotations import AnnotationLike
from ir.sim import SimResult, simulate

__all__ = [
    "DECODE_BLOCKS_ABOVE",
    "FRONT_BATCHES",
    "AnnotatedDecode",
    "ServingSession",
    "check_fits",
    "decode_title",
    "mix_fields",
    "serving_model",
    "widest",
]

# A decode step is one task per device: a bar per task would be one bar. Its ops are drawn
# (a 70B step on 8 GPUs: 17,328 events, 0.02 s to build), summarised above 3,000 a device.
DECODE_BLOCKS_ABOVE: int | None = None
FRONT_BATCHES = (1, 8, 64)  # the decode batches the views' front simulates (those that fit)


def serving_model(name: str) -> Function:
    """The forward program of a model name the serving views offer: a published Llama
    shape (:data:`ir.models_llama.LLAMA_SHAPES`), bfloat16, its full context."""
    return llama_preset(name)


def decode_title(result: SimResult, mix: RequestMix, how: str = "") -> str:
    """The decode step's Gantt title: its time, devices and batch (``how``: e.g. the
    placement that made it)."""
    from widgets.units import format_time

    n = len(result.devices)
    text = (
        f"decode step {format_time(result.step_time_s)} on {n} device{'s' * (n != 1)}: "
        f"{mix.batch} sequences at context {mix.mean_context}"
    )
    return f"{text} · {how}" if how else text


def widest(forward: Function, gpus: int) -> ServingStrategy:
    """The most tensor parallelism ``forward``'s heads allow on ``gpus`` GPUs, the rest
    replicas (no pipeline): the lowest latency a replica of one node gets."""
    return max((s for s in strategies(forward, gpus) if s.pp == 1), key=lambda s: s.tp)


@dataclass(frozen=True)
class AnnotatedDecode:
    """The decode step as annotated, propagated and simulated (CUDA graphs as the metrics)."""

    annotations: dict[str, Any]
    program: Function
    result: SimResult
    report: Any  # the propagation report: which redistributions it inserted, and why

    @property
    def tpot_s(self) -> float:
        return self.result.step_time_s


def check_fits(m: ServingMetrics) -> None:
    """Refuse a decode batch the strategy's GPUs cannot hold, by how much."""
    if not m.fits:
        most = m.max_batch()
        raise ServingError(
            f"a batch of {m.mix.batch} sequences of {m.mix.final_context} positions does not fit "
            f"{m.strategy.label} on {m.topology}: the largest is {most}, {m.mix.batch - most} "
            "over; lower the batch or the lengths, or serve on more GPUs"
        )


def mix_fields(mix: RequestMix) -> dict[str, int]:
    """The request mix's fields by name (to change some with ``RequestMix(**...)``)."""
    return {
        "prompt_len": mix.prompt_len,
        "output_len": mix.output_len,
        "batch": mix.batch,
        "prefill_batch": mix.prefill_batch,
    }


class ServingSession:
    """See the module docstring. ``cuda_graphs``: decode replayed from a CUDA graph."""

    def __init__(
        self,
        forward: Function,
        topology: Topology,
        mix: RequestMix | None = None,
        strategy: ServingStrategy | None = None,
        *,
        cuda_graphs: bool = True,
    ) -> None:
        self.forward, self.topology = forward, topology
        self.mix = mix or RequestMix()
        self.cuda_graphs = cuda_graphs
        self._strategy = strategy or ServingStrategy()
        self._metrics: dict[tuple, ServingMetrics] = {}
        self._front: ServingFront | None = None
        self._hand: dict[str, AnnotationLike] = {}  # values placed by hand, by name
        self._placed: dict[tuple, dict[str, Any]] = {}  # the strategy's, for the last choice
        self._annotated: AnnotatedDecode | None = None

    # -- choices -----------------------------------------------------------------------

    @property
    def strategy(self) -> ServingStrategy:
        return self._strategy

    def set_strategy(self, tp: int = 1, pp: int = 1, replicas: int = 1) -> ServingSession:
        """Serve by ``tp`` x ``pp`` x ``replicas`` (refused, the session unchanged, when the
        model or the topology cannot take it); hand annotations are dropped."""
        strategy = ServingStrategy(tp, pp, replicas)
        self._metrics_for(strategy, self.mix)  # raises before anything changes
        self._strategy, self._hand, self._annotated = strategy, {}, None
        return self

    def set_mix(self, **fields: int) -> ServingSession:
        """Change the request mix (``prompt_len``, ``output_len``, ``batch``,
        ``prefill_batch``); the front is recomputed on demand."""
        mix = replace(self.mix, **fields)
        self._metrics_for(self._strategy, mix)
        self.mix, self._front, self._annotated = mix, None, None
        return self

    # -- answers -------------------------------------------------------------------------

    def _metrics_for(self, strategy: ServingStrategy, mix: RequestMix) -> ServingMetrics:
        key = (strategy, mix)
        if key not in self._metrics:
            self._metrics[key] = serving_metrics(
                self.forward, self.topology, strategy, mix, cuda_graphs=self.cuda_graphs
            )
        return self._metrics[key]

    @property
    def metrics(self) -> ServingMetrics:
        """The strategy's figures for the request mix (simulated once per choice)."""
        return self._metrics_for(self._strategy, self.mix)

    def front(
        self,
        batches: tuple[int, ...] | None = None,
        progress: bool = False,
        on_step: Callable[[int, int], None] | None = None,
    ) -> ServingFront:
        """Every strategy of the topology's GPUs at several batches (kept until the mix
        changes; ``batches`` given: computed again). ``on_step(done, total)`` after each
        strategy (the dashboard's progress bar); a cancelled task stops between strategies
        (``ir.interrupt``)."""
        if self._front is None or batches is not None:
            from tqdm.auto import tqdm

            todo = list(strategies(self.forward, len(self.topology.devices)))
            front = ServingFront([])
            for i, s in enumerate(tqdm(todo, desc="serving strategies", disable=not progress)):
                interrupt.check()  # a dashboard's Cancel stops here, between strategies
                part = serving_front(
                    self.forward,
                    self.topology,
                    self.mix,
                    candidates=[s],
                    batches=batches,
                    cuda_graphs=self.cuda_graphs,
                )
                front.points += part.points
                front.refused.update(part.refused)
                if on_step is not None:
                    on_step(i + 1, len(todo))
            self._front = front
        return self._front

    @property
    def computed_front(self) -> ServingFront | None:
        """The front if computed (:meth:`front`), else None."""
        return self._front

    def keep_front_of(self, other: ServingSession) -> None:
        """Take ``other``'s computed front when it is this session's too: the same model,
        GPUs, prompts and outputs (the front covers every strategy and batch)."""
        same = (
            other.forward is self.forward
            and other.topology == self.topology
            and other.cuda_graphs == self.cuda_graphs
            and replace(other.mix, batch=self.mix.batch) == self.mix
        )
        if same and other._front is not None:
            self._front = other._front

    def decode(self) -> Function:
        """The decode step the metrics time: ``batch`` sequences at the mean context."""
        return decode_step(self.forward, self.mix.mean_context, batch=self.mix.batch)

    def annotations(self) -> dict[str, Any]:
        """The decode step's annotations: the strategy's placements on one replica (tensor
        parallel; the others serve other requests alike), with the values placed by hand
        over them."""
        if self._strategy.pp > 1:
            raise ServingError(
                f"annotations here place one tensor-parallel replica; {self._strategy.label} "
                "has a pipeline: choose pp = 1 to edit placements"
            )
        key = (self._strategy.tp, self.mix)
        if key not in self._placed:  # the step's own placements, once per choice
            replica = ServingStrategy(tp=self._strategy.tp)
            self._placed = {key: serving_annotations(self.decode(), replica)}
        return {**self._placed[key], **self._hand}

    def annotate(self, name: str, layout: AnnotationLike) -> AnnotatedDecode:
        """Place the decode step's value ``name`` (a weight or a cache) by hand, propagate,
        simulate: the new TPOT. A placement propagation refuses leaves the session as it
        was."""
        hand = {**self._hand, name: layout}
        annotated = self._propagated({**self.annotations(), name: layout})
        self._hand, self._annotated = hand, annotated
        return annotated

    def annotated(self) -> AnnotatedDecode:
        """The decode step with the current annotations, propagated and simulated."""
        if self._annotated is None:
            self._annotated = self._propagated(self.annotations())
        return self._annotated

    def _propagated(self, annotations: dict[str, Any]) -> AnnotatedDecode:
        program, report = propagate(self.decode(), annotations)
        graphs = with_host(self.topology, CUDA_GRAPH_HOST) if self.cuda_graphs else self.topology
        return AnnotatedDecode(dict(annotations), program, simulate(program, graphs), report)

    # -- views -------------------------------------------------------------------------

    def payload(self, *, front: bool = False) -> dict[str, Any]:
        """What the serving panel draws: the summary rows, the KV-cache memory curve, the
        decode step's Gantt and, with ``front`` (or once computed), the front."""
        from widgets.gantt import gantt_spec
        from widgets.serving import front_spec, kv_memory_spec, summary_rows

        m = self.metrics
        out: dict[str, Any] = {
            "summary": summary_rows(m),
            "kv_memory": kv_memory_spec(m),
            "decode_gantt": gantt_spec(
                m.decode,
                m.decode_program,
                title=decode_title(m.decode, m.mix),
                blocks_above=DECODE_BLOCKS_ABOVE,
            ),
        }
        if front or self._front is not None:
            out["front"] = front_spec(self.front())
        return out

    def report_parts(
        self,
        *,
        front: bool = True,
        batches: tuple[int, ...] | None = None,
        name: str | None = None,
        progress: bool = False,
    ) -> list[tuple[str, Any]]:
        """The report's serving section as (heading, part) pairs for
        :func:`widgets.static_html.page_html`: the summary, the memory curve, the decode
        step's Gantt and, with ``front``, the front (``batches``: its decode batches);
        ``name``: the model's (default: the forward program's); ``progress``: a bar over
        the front's strategies."""
        from widgets.gantt import gantt_figure
        from widgets.serving import front_figure, kv_memory_figure, summary_html

        m = self.metrics
        where = f"{name or self.forward.name}, {m.strategy.label} on {self.topology.name}"
        parts: list[tuple[str, Any]] = [
            (f"Serving {where}", summary_html(m)),
            ("KV cache memory against context", kv_memory_figure(m)),
            (
                "The decode step",
                gantt_figure(
                    m.decode,
                    m.decode_program,
                    title=decode_title(m.decode, m.mix),
                    blocks_above=DECODE_BLOCKS_ABOVE,
                ),
            ),
        ]
        if front:
            front_of = self.front(batches, progress=progress)
            parts.append(("Latency against throughput", front_figure(front_of)))
        return parts

    def report_html(self, *, front: bool = True) -> str:
        """The report's serving section as an HTML fragment (plotly figures without
        plotly.js: the page includes it once)."""
        out = []
        for heading, part in self.report_parts(front=front):
            out.append(f"<h2>{html.escape(heading)}</h2>")
            if isinstance(part, str):
                out.append(part)
            else:
                out.append(part.to_html(full_html=False, include_plotlyjs=False))
        return "\n".join(out)
