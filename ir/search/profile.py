"""What the estimator knows of a training step: its per-device ops under a tensor-parallel
degree, and how their shapes scale with the microbatch and the degree.

A :class:`Profile` is the analysis ``T.megatron`` makes of one strategy (its
``MegatronPlan``: the local ops of one microbatch on one device, the tensor-parallel
conversions, the optimizer steps) read as *records*. Analysing every (microbatch size,
degree) of a big space would cost seconds each; instead the estimator analyses a few. A
record's batch dimensions are those its values are split along over the batch's pieces
(the plan's data level says, value by value: one analysis per degree, at any number of
pieces); the dimensions the degree splits are found by comparing two degrees record by
record (matched by the names of the values they make): one that halves when the degree
doubles. A record's shapes at any (rows, degree) follow, and its time is asked of the
same cost rules and device methods the simulator uses (``Device.op_time_s``,
``Device.host_time_s``, ``Collective.time_s``), not of a copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..collectives import Collective
from ..device import Topology
from ..errors import DistIRError
from ..function import Function
from ..op import Op
from ..registry import CostContext, get_op
from ..transforms._megatron_plan import MegatronPlan
from ..transforms._megatron_shared import SharedAnalyses
from ..transforms._spmd import P, R
from ..transforms.stage_cut import StageCuts, annotated_stages
from ..types import TensorType, compute_dtype
from ..value import Value


class NotEstimableError(Exception):
    """A record's shapes do not scale to the asked (rows, degree): the transform would
    refuse or arrange it otherwise; the strategy is left to the simulator."""


class RefusedError(NotEstimableError):
    """The transform's own stage cut refuses the strategy (its message): no program to
    simulate."""


@dataclass
class Record:
    """A local op (``kind`` "op") or a tensor-parallel conversion (a collective kind) of
    one microbatch on one device: its types at the profile's (rows, degree), and per
    type and dimension the exponents ``(batch, split)`` it scales by."""

    name: str
    kind: str
    phase: str
    op: Op | None
    types: list[TensorType]  # inputs then outputs (a conversion: its one tensor)
    n_in: int
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    scale: list[list[tuple[int, int]]] = field(default_factory=list)
    converted: str = ""  # a conversion: the name of the value it makes (what ops read)
    batch_known: bool = True  # False: a value the data level does not name (its rows fixed)

    def shapes(self, rows_ratio: float, split_ratio: float) -> list[tuple[int, ...]]:
        """The shapes at ``rows / rows_ref`` and ``degree_ref / degree``."""
        if not self.batch_known and rows_ratio != 1.0:
            raise NotEstimableError(f"{self.name}: which dimensions follow the batch is unknown")
        out = []
        for t, dims in zip(self.types, self.scale):
            shape = []
            for d, (b, s) in zip(t.shape, dims):
                x = d * (rows_ratio if b else 1.0) * (split_ratio if s else 1.0)
                n = round(x)
                if n < 1 or abs(x - n) > 1e-9 * max(1.0, x):
                    raise NotEstimableError(f"{self.name}: dimension {d} does not scale to {x}")
                shape.append(n)
            out.append(tuple(shape))
        return out


def _kind(item: Any) -> str:
    src, dst = item.src, item.dst
    if dst == R and src.kind == "S":
        return "allgather"
    if dst == R and src == P:
        return "allreduce"
    if dst.kind == "S" and src == P:
        return "reducescatter"
    return "local"


class Profile:
    """The records of one ``MegatronPlan`` (of ``t`` at ``tp`` and ``pieces``; ``shared``:
    analyses of ``t`` shared with the search's other plans, as ``T.megatron`` takes them)."""

    def __init__(
        self,
        t: Function,
        tp: int,
        pieces: int,
        sequence_parallel: bool = False,
        shared: SharedAnalyses | None = None,
    ):
        plan = MegatronPlan(t, 1, tp, 1, pieces, "1f1b", 1, 0, 0, sequence_parallel, shared=shared)
        self.plan, self.tp, self.pieces = plan, tp, pieces
        self.records: list[Record] = []
        seen: dict[str, int] = {}
        local = plan.hplan.local
        # sequence parallelism's all-gathers made again for the backward (Korthikanti et
        # al. 2022, 4.2.2; in the backward's tasks, not the plan's items) keep their token
        # slices from the forward to the backward. (Their time is left out: the simulator
        # overlaps them with the backward's compute; counted, the step estimates of
        # GPT-3-shaped layers rose from 1.5 % to 2.9 % over the simulation.)
        self.regathered = {
            local.value(x.keys[0]).name
            for task in plan.tasks.values()
            for x in task
            if x.regather and x.op is None
        }
        # each value's batch dimension: the one the data level splits it along over the
        # pieces (a tensor-parallel conversion's result: its operand's)
        key_of, state = plan.key_of, plan.dplan.state
        converts: dict[Value, Value] = {}

        def scale_of(values: Sequence[Value], types: list[TensorType]) -> list | None:
            if len(values) != len(types):
                return None
            out = []
            for v, x in zip(values, types):
                key = key_of.get(converts.get(v, v))
                if key is None:
                    return None
                dims = [(0, 0)] * len(x.shape)
                st = state.get(key)
                if st is not None and st.kind == "S" and st.dim < len(dims):
                    dims[st.dim] = (1, 0)
                out.append(dims)
            return out

        for item in plan.items:
            if item.op is None:
                key = item.keys[0]
                if item.outputs:
                    converts[item.outputs[0]] = converts.get(key, key)
                source = local.value(key)
                name = f"{key.name}#conv{seen.setdefault(key.name + '#', 0)}"
                seen[key.name + "#"] += 1
                # what it reads: a backward conversion of a forward value keeps it alive
                reads = (source.name,)
                rec = Record(name, _kind(item), item.phase, None, [source.type], 1, reads, ())
                if item.outputs:
                    rec.converted = local.value(item.outputs[0]).name
                values: Sequence[Value] = (key,)
            else:
                op = item.op
                first = op.outputs[0].name if op.outputs else op.op_type
                k = seen.get(first, 0)
                seen[first] = k + 1
                types = [v.type for v in (*op.inputs, *op.outputs)]
                if not all(isinstance(x, TensorType) for x in types):
                    continue  # a tuple-typed op (rare): left out of the estimate
                reads = tuple(v.name for v in op.inputs)
                writes = tuple(v.name for v in op.outputs)
                rec = Record(
                    f"{first}#{k}", "op", item.phase, op, types, len(op.inputs), reads, writes
                )
                values = (*item.keys, *item.outputs)
            scale = scale_of(values, rec.types)
            rec.batch_known = scale is not None
            rec.scale = scale or [[(0, 0)] * len(x.shape) for x in rec.types]
            self.records.append(rec)
        self.by_name = {r.name: r for r in self.records}
        self._stages: dict[int, np.ndarray] = {}
        self._assignments: dict[tuple, Any] = {}
        self._cuts: dict[Function, StageCuts] = {}

    def infer_split(self, other: Profile, only: set[str]) -> None:
        """Mark the dimensions that halve in ``other`` (the same step at twice the degree)
        as split by the degree, of the records named in ``only``."""
        for rec in self.records:
            if rec.name not in only:
                continue
            twin = other.by_name.get(rec.name)
            if twin is None or len(twin.types) != len(rec.types):
                continue
            for dims, a, b in zip(rec.scale, rec.types, twin.types):
                if len(a.shape) != len(b.shape):
                    continue
                for i, (x, y) in enumerate(zip(a.shape, b.shape)):
                    if x == 2 * y and x != y:
                        dims[i] = (dims[i][0], 1)

    def split_from(self, base: Profile) -> set[str]:
        """This profile's degree against ``base`` (degree 1, the same pieces): a dimension
        ``degree`` times smaller here is split by the degree; a conversion's tensor scales
        as the result of the op that makes it. Returns the names of the records ``base``
        has no twin of (ops only the split step has: a vocabulary-parallel embedding or
        loss), whose split dimensions this leaves to :meth:`infer_split`."""
        factor = self.tp // base.tp
        made: dict[str, list[tuple[int, int]]] = {}
        made_known: dict[str, bool] = {}
        twinned: set[str] = set()
        for rec in self.records:
            twin = base.by_name.get(rec.name)
            if rec.op is None or twin is None or len(twin.types) != len(rec.types):
                continue
            twinned.add(rec.name)
            for dims, here, there in zip(rec.scale, rec.types, twin.types):
                if len(here.shape) != len(there.shape):
                    continue
                for i, (x, y) in enumerate(zip(here.shape, there.shape)):
                    dims[i] = (dims[i][0], int(x * factor == y and x != y))
            for w, dims in zip(rec.writes, rec.scale[rec.n_in :]):
                made[w] = dims
                made_known[w] = rec.batch_known
        for rec in self.records:
            if rec.op is None:
                source = rec.name.split("#conv")[0]
                dims = made.get(source)
                if dims is not None and len(dims) == len(rec.types[0].shape):
                    rec.scale = [list(dims)]
                    rec.batch_known = rec.batch_known and made_known[source]
        return {
            r.name
            for r in self.records
            if (r.op is None and r.name.split("#conv")[0] not in made)
            or (r.op is not None and r.name not in twinned)
        }

    def finish(self, replayed: set[str]) -> None:
        """Group the records into classes that cost the same at any (rows, degree): one op
        type, attributes, types and scaling, and the same outputs kept for the backward
        (and replayed by recomputation). A model's identical layers share classes, so a
        (rows, degree) costs each class once (:meth:`class_of`)."""
        read_back = {name for r in self.records if r.phase == "B" for name in r.reads}
        read_back |= self.regathered
        step_outputs = {v.name for v in self.plan.t.outputs}
        self.phase = np.asarray([r.phase == "B" for r in self.records], dtype=np.int64)
        self.is_conv = np.asarray([r.op is None for r in self.records], dtype=bool)
        classes: dict[tuple, int] = {}
        self.classes: list[tuple[Record, tuple[bool, ...], bool]] = []
        self.returned: list[tuple[bool, ...]] = []  # per class: which results it returns
        ids = []
        for r in self.records:
            kept = tuple(w in read_back for w in r.writes) if r.phase == "F" else ()
            again = r.phase == "F" and bool(r.writes) and r.writes[0] in replayed
            # what the step returns per microbatch (a model's logits): live to its end
            returned = tuple(w in step_outputs for w in r.writes)
            sig = (
                r.kind,
                r.op.op_type if r.op is not None else None,
                _attributes(r.op) if r.op is not None else None,
                tuple(r.types),
                tuple(tuple(x) for x in r.scale),
                kept,
                again,
                returned,
            )
            k = classes.get(sig)
            if k is None:
                k = classes[sig] = len(self.classes)
                self.classes.append((r, kept, again))
                self.returned.append(returned)
            ids.append(k)
        self.class_of = np.asarray(ids, dtype=np.int64)
        self.again = np.asarray([c[2] for c in self.classes], dtype=bool)
        self.class_is_conv = np.asarray([c[0].op is None for c in self.classes], dtype=bool)
        self.forward_ops = np.flatnonzero((self.phase == 0) & ~self.is_conv)
        self._counts: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def assignment(self, stages: int) -> dict[Op, int]:
        """``T.megatron``'s stage of each op of the analysed step among ``stages`` (shared
        with the profiles of the same step: ``share``); a cut it refuses raises."""
        t = self.plan.t
        found = self._assignments.get((t, stages))
        if found is None:
            try:
                cuts = self._cuts.get(t)
                if cuts is None:  # what every stage count reads, analysed once
                    cuts = self._cuts[t] = StageCuts(t, annotated_stages(t, None))
                found = cuts.assignment(stages)
            except DistIRError as e:
                found = e
            self._assignments[(t, stages)] = found
        if isinstance(found, Exception):
            raise RefusedError(str(found).splitlines()[0])
        return found

    def counts(self, stages: int) -> tuple[np.ndarray, np.ndarray]:
        """Among ``stages``: per stage and phase (rows ``2 stage + phase``, phase 1 the
        backward), how many records of each class it holds (columns); and per stage, the
        class of its last forward op (-1: none). A model's identical layers make a few
        classes of many records, so a (rows, degree) sums its stages from these counts,
        never record by record (``Estimator._stages``)."""
        found = self._counts.get(stages)
        if found is None:
            stage, n = self.stage_of(stages), len(self.classes)
            slot = stage * 2 + self.phase
            flat = np.bincount(slot * n + self.class_of, minlength=2 * stages * n)
            at = np.full(stages, -1, dtype=np.int64)  # each stage's last forward op
            forward = self.forward_ops
            np.maximum.at(at, stage[forward], forward)
            last = np.where(at >= 0, self.class_of[at], -1)
            found = self._counts[stages] = (flat.reshape(2 * stages, n).astype(np.float64), last)
        return found

    def share(self, other: Profile) -> None:
        """Use ``other``'s stage cuts (of the same step) as this profile's."""
        self._assignments, self._cuts = other._assignments, other._cuts

    def stage_of(self, stages: int) -> np.ndarray:
        """Each record's pipeline stage among ``stages`` (as ``T.megatron`` would cut the
        step; a conversion in its neighbour's stage)."""
        found = self._stages.get(stages)
        if found is None:
            by_name: dict[str, int] = {}
            for op, s in self.assignment(stages).items():
                for v in op.outputs:
                    by_name.setdefault(v.name, s)
            found = np.zeros(len(self.records), dtype=np.int64)
            last = 0
            for i, rec in enumerate(self.records):
                if rec.op is not None:
                    last = by_name.get(rec.writes[0] if rec.writes else "", last)
                    found[i] = last
                else:  # where the value it converts is made
                    found[i] = by_name.get(rec.name.split("#conv")[0], last)
            self._stages[stages] = found
        return found


class Costs:
    """Op and collective times on one topology's first device model (memoised by shape)."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.device = topology.devices[0]
        self._ops: dict[tuple, tuple[float, float]] = {}
        self._comm: dict[tuple, float] = {}

    def op(self, op: Op, shapes: Sequence[tuple[int, ...]], types: Sequence[TensorType],
           n_in: int) -> tuple[float, float]:  # fmt: skip
        """(device seconds, host seconds) of ``op`` on operands and results of ``shapes``."""
        key = (op.op_type, _attributes(op), tuple(shapes), tuple(t.dtype for t in types))
        found = self._ops.get(key)
        if found is None:
            local = [TensorType(s, t.dtype) for s, t in zip(shapes, types)]
            ctx = CostContext(tuple(local[:n_in]), tuple(local[n_in:]), op.attributes)
            cost = get_op(op.op_type).cost_rule(ctx)
            d, topo = self.device, self.topology
            dtype = compute_dtype(local)
            found = (d.op_time_s(cost, dtype, allow_tf32=topo.allow_tf32), d.host_time_s(cost))
            self._ops[key] = found
        return found

    def add(self, size_bytes: float, dtype: Any) -> tuple[float, float]:
        """(device, host) seconds of an ``Add`` of two tensors of ``size_bytes`` (a gradient
        summed over microbatches: the body that makes it adds it to the sum so far)."""
        key = ("Add", size_bytes, dtype)
        found = self._ops.get(key)
        if found is None:
            n = max(1, round(size_bytes / dtype.itemsize_bytes))
            x = TensorType((n,), dtype)
            cost = get_op("Add").cost_rule(CostContext((x, x), (x,), {}))
            topo = self.topology
            found = self._ops[key] = (
                self.device.op_time_s(cost, dtype, allow_tf32=topo.allow_tf32),
                self.device.host_time_s(cost),
            )
        return found

    def collective(self, kind: str, size_bytes: float, devices: tuple[int, ...]) -> float:
        """Seconds of ``kind`` moving ``size_bytes`` (as the comm rules size it) among
        ``devices`` (``Collective.time_s``, the simulator's model)."""
        if kind == "local" or len(set(devices)) < 2:
            return 0.0
        key = (kind, size_bytes, devices)
        found = self._comm.get(key)
        if found is None:
            ids = self.topology.device_ids
            mapped = tuple(ids[d % len(ids)] for d in devices)
            root = mapped[-1] if kind == "send" else None
            found = Collective(kind, size_bytes, mapped, root).time_s(self.topology)
            self._comm[key] = found
        return found


def _attributes(op: Op) -> Any:
    if not op.attributes:
        return ()
    key = tuple(sorted(op.attributes.items()))
    try:
        hash(key)
    except TypeError:
        return repr(key)  # an unhashable value: its text
    return key


def replayed_names(t: Function, recomputed: Function | None = None) -> set[str]:
    """The values ``T.recompute(t)`` makes twice (the forward's and the replay);
    ``recomputed``: that step, if made already."""
    from ..transforms import recompute

    counts: dict[str, int] = {}
    for op in (recomputed if recomputed is not None else recompute(t)).ops:
        for v in op.outputs:
            counts[v.name] = counts.get(v.name, 0) + 1
    return {n for n, c in counts.items() if c > 1}
