"""3D parallelism as Megatron-LM and DeepSpeed arrange it: one steady-state training step.

``megatron(t, dp, tp, pp, microbatches, schedule)`` cuts the model into ``pp``
consecutive layer groups (pipeline stages; ``pp * chunks`` with the
interleaved schedule), runs tensor (Megatron column/row) parallelism inside
each stage over ``tp`` devices, and data parallelism over ``dp`` replicas.
Devices are numbered as Megatron-LM numbers ranks: tensor-parallel peers are
adjacent (they share NVLink), then data-parallel replicas, then stages:
device ``base + s * dp * tp + i * tp + j`` is stage ``s``, replica ``i``, tensor
rank ``j``.

The program is *logical*: every value of a stage is one flat tuple over the
stage's ``dp * tp`` devices, each (stage, microbatch, phase) task runs as
``Pmap`` s over those devices (one body, written once, whatever the number of
devices), tensor-parallel conversions are *grouped* collectives
(``AllReduce(..., groups=[[0, 1], [2, 3]])``: one collective per replica, all at
once), activations move to the next stage with one ``SendEach``, and each
weight's gradient, summed over microbatches, is all-reduced among the replicas
that hold the same shard (``groups=[[0, 2], [1, 3]]``) as soon as its last
microbatch's backward has made it, so it overlaps the rest of the backward
pass. The optimizer then steps every shard on its own device. The op count
grows with layers x microbatches, not with devices.

The step is steady state (DESIGN.md): weights and optimizer state are inputs
on the devices that own them (layouts ``("R@dp", "S(k)@tp")`` or
``("R@dp", "R@tp")``), each batch input arrives split into microbatches and
replicas on the stage that reads it (``("S(0)", "S(0)@dp", "R@tp")``), and the
outputs are the updated shards in the same layouts, the loss as per-replica
partial sums (``"P@dp"``) and batch-shaped outputs in their inputs' layout.
``ir.distribute`` / ``ir.collect`` turn sequential values into these and back.

Two switches change how the data and tensor levels hold state:

* ``zero=1`` / ``zero=2`` (ZeRO, Rajbhandari et al. 2020, as DeepSpeed and
  Megatron-LM's distributed optimizer run it): the replicas of a shard split its
  optimizer state (layout ``("S(k)@dp", ...)``, along an axis other than the
  tensor-parallel one that divides by ``dp``); the gradient is reduce-scattered
  among them instead of all-reduced, each replica updates its part of the weight
  (``KeepShard``: no transfer) and the parts are all-gathered into the next step's
  replicated weight. Stage 1 reduce-scatters the gradient summed over all
  microbatches, so the whole gradient lives through the accumulation; stage 2
  reduce-scatters every microbatch's gradient as it is made and sums only the
  part (DeepSpeed's ZeRO-2: less memory, one reduce-scatter per microbatch; with
  one microbatch the two stages are the same program). A weight with no such axis
  (a bias split by the tensor level) keeps its state replicated and its gradient
  all-reduced.
* ``sequence_parallel=True`` (Korthikanti et al. 2022): between tensor-parallel
  regions, residual adds and layer norms run on a slice of the tokens each; the
  row-parallel partial sums are reduce-scattered along the tokens instead of
  all-reduced, the token slices all-gathered before each column-parallel MatMul
  and again in the backward pass (the gathered copy is not kept), and a layer
  norm's weight gradient is all-reduced over the tensor group. It needs ``tp > 1``
  (with ``tp = 1`` it changes nothing). The first layer norm, before any
  tensor-parallel region has made a partial sum, runs on all tokens.

:func:`gradient_accumulation` is the one-stage case: microbatches run one after
another (forward then backward each), summing weight gradients before one
optimizer step, so one microbatch's activations live at a time.

Limits (each raises a TransformError naming the level): the batch must divide
into ``dp * microbatches`` equal pieces, tensor-parallel splits must be even,
a weight may be read by one stage only (no tied embeddings across stages), and
ops that need the whole batch before the backward pass (batch norm) cannot be
pipelined.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..arguments import bool_arg
from ..builder import FunctionBuilder
from ..errors import VerifyError
from ..function import Function
from ..layout import with_layouts
from ..op import Op
from ..registry import get_op
from ..types import DeviceVar, TensorType, TupleType
from ..value import Value
from ..verify import describe_op
from ._rewrite import (
    TransformError,
    batch_inputs,
    batch_size,
    check_common,
    check_devices,
    is_optimizer,
    localize_op,
)
from ._rules import data_rule
from ._spmd import P, R, Shard
from ._spmd import Plan as _Plan
from .data_parallel import data_plan
from .horizontal import horizontal_plan
from .pipeline import (
    SCHEDULES,
    _device_sequence,
    backward_ops,
    run_schedule,
    stage_assignment,
)

_VAR = "e"


def _positive(name: str, n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise TransformError(f"{name} must be a positive integer, got {n!r}")
    return n


def _level(state: Shard | None, n: int) -> str:
    if state is None or state == R:
        return f"R@{n}"
    return f"P@{n}" if state == P else f"S({state.dim})@{n}"


@dataclass(eq=False)
class _Item:
    """One step of the tensor-parallel plan: a local op, or a conversion (collective)."""

    index: int
    op: Op | None  # the local (per-device) op, or None for a conversion
    keys: tuple[Value, ...]
    outputs: tuple[Value, ...]
    stage: int = 0
    phase: str = "F"
    src: Shard = R
    dst: Shard = R
    grads: list[Value] = field(default_factory=list)  # summed keys this item completes
    regather: bool = False  # a forward all-gather of token slices made again for backward


class TensorSplitError(TransformError):
    """Tensor parallelism over the asked ranks splits no weight of the program."""


def _copy_op(builder: FunctionBuilder, op: Op, inputs: list[Value]) -> tuple[Value, ...]:
    """``op`` (of a plan's per-device program: built, so verified) added to ``builder`` on
    ``inputs``, keeping its names: typed again only if the operand types differ."""
    try:
        return builder.add_like(op, inputs, [v.name for v in op.outputs]).outputs
    except VerifyError as e:
        raise VerifyError(f"{e}\n  while rebuilding: {describe_op(op)}") from None


class _Megatron:
    def __init__(
        self,
        t: Function,
        dp: int,
        tp: int,
        pp: int,
        m: int,
        schedule: str,
        chunks: int,
        base: int,
        zero: int = 0,
        sequence_parallel: bool = False,
        stage_of: Mapping[str, int] | None = None,
    ) -> None:
        self.t, self.dp, self.tp, self.pp, self.m = t, dp, tp, pp, m
        self.sequence_parallel = sequence_parallel and tp > 1
        self.stage_of = stage_of
        self.v, self.n = chunks, dp * tp
        self.stages = pp * chunks
        self.base = base
        self.zero = zero if dp > 1 else 0
        self._analyse(schedule)
        self._plan_zero()

    # -- analysis --------------------------------------------------------------------------

    def _analyse(self, schedule: str) -> None:
        t, dp, m = self.t, self.dp, self.m
        batch = batch_inputs(t)
        if not batch:
            raise TransformError(f"{t.name} has no batch input to split over replicas")
        rows = batch_size(t, batch)
        if rows % (dp * m):
            raise TransformError(
                f"data level: the batch of {rows} rows does not split into {dp} replicas x "
                f"{m} microbatches of equal size; choose dp * microbatches dividing {rows}"
            )
        # Data plan over dp * m pieces: the per-piece program (global loss denominators),
        # the gradients it leaves partial, and the optimizer steps after their all-reduce.
        dplan = data_plan(t, dp * m, what="dp x microbatches")
        self.dplan = dplan
        sliced = [st.keys[0].name for st in dplan.steps if st.op is None and st.src == R]
        if sliced:
            raise TransformError(
                f"data level: {sliced} are whole-batch values made from no batch input (a "
                "class token broadcast to the batch) that the replicas slice; slicing them "
                "per microbatch is not supported yet: use T.data_parallel"
            )
        late: set[Value] = {st.keys[1] for st in dplan.steps if st.op is None}
        self.post: list[Op] = []
        self.post_keys: dict[Op, tuple[Value, ...]] = {}
        piece_ops: list[tuple[int, Op]] = []
        for i, st in enumerate(dplan.steps):
            if st.op is None:
                continue
            if any(k in late for k in st.keys):
                if any(dplan.state[k] != R for k in st.keys if k not in late):
                    raise TransformError(
                        f"pipeline level: {st.op.op_type} needs a value summed over the whole "
                        "batch before the batch is done; it cannot be pipelined"
                    )
                late.update(st.op.outputs)
                self.post.append(st.op)
                self.post_keys[st.op] = st.keys
            else:
                piece_ops.append((i, st.op))
        if any(not is_optimizer(op) for op in self.post):
            shown = sorted({op.op_type for op in self.post if not is_optimizer(op)})
            raise TransformError(
                f"3D parallelism runs only optimizer steps after the gradient all-reduce; "
                f"{t.name} also runs {shown} there"
            )
        self.conv_dst = {st.keys[1]: st for st in dplan.steps if st.op is None}
        self._summed_sources = {st.keys[0] for st in self.conv_dst.values() if st.src == P}
        # The per-piece program: the local ops of the data plan (batch / (dp m) rows).
        loc = dplan.local
        b = FunctionBuilder(f"{t.name}_piece")
        env: dict[Value, Value] = {}
        self.source_of: dict[Value, Value] = {}  # piece input -> source key
        for i, _ in piece_ops:
            local = loc.step_ops[i]
            ins = []
            for k, lv in zip(dplan.steps[i].keys, local.inputs):
                if lv not in env:
                    env[lv] = b.input(k.name, lv.type)
                    self.source_of[env[lv]] = k
                ins.append(env[lv])
            for x, y in zip(local.outputs, _copy_op(b, local, ins)):
                env[x] = y
        self.key_of = {env[loc.env[k]]: k for k in loc.env if loc.env[k] in env}
        needed = [st.keys[0] for st in self.conv_dst.values()]
        needed += [dplan.current[v] for v in t.outputs if dplan.current[v] not in late]
        self.piece_out = list(dict.fromkeys(env[loc.env[k]] for k in needed))
        self.piece = b.finish(self.piece_out)
        self.summed = {env[loc.env[st.keys[0]]] for st in self.conv_dst.values() if st.src == P}
        self.summed |= {
            env[loc.env[dplan.current[v]]]
            for v in t.outputs
            if dplan.state[dplan.current[v]] == P and dplan.current[v] not in late
        }
        # Stages (of the source program's ops) and the tensor-parallel plan of the piece.
        stage_of_op = stage_assignment(t, self.stages, self.stage_of)
        backward = backward_ops(t)
        piece_stage = {
            loc.step_ops[i]: (stage_of_op[op], "B" if op in backward else "F")
            for i, op in piece_ops
        }
        rebuilt = dict(zip([loc.step_ops[i] for i, _ in piece_ops], self.piece.ops))
        self.stage_of_post = {op: stage_of_op[op] for op in self.post}
        if self.tp > 1:
            lead = self._token_shape() if self.sequence_parallel else None
            if lead is not None and lead[-1] % self.tp:
                # one pmap body serves every tensor-parallel rank: the blocks must be equal
                raise TransformError(
                    f"sequence parallelism splits the {lead[-1]} tokens along axis "
                    f"{len(lead) - 1} of {t.name}'s activations {self.tp} ways; give a length "
                    f"divisible by tp={self.tp} (or sequence_parallel=False)"
                )
            hplan = horizontal_plan(self.piece, self.tp, _VAR, sequence=lead)
            if not any(s is not None and s.kind == "S" for s in hplan.state.values()):
                raise TensorSplitError(
                    f"tensor level: no weight of {t.name} splits {self.tp} ways (tensor "
                    "parallelism splits MatMul pairs and attention heads)"
                )
        else:
            hplan = _Plan(self.piece, 1, {}, data_rule, _VAR)
        self.hplan = hplan
        self._gradients_in_weight_layout()
        stage_of_piece = {rebuilt[k]: v for k, v in piece_stage.items()}
        self.items: list[_Item] = []
        for i, st in enumerate(hplan.steps):
            if st.op is None:
                self.items.append(
                    _Item(i, None, (st.keys[0],), (st.keys[1],), src=st.src, dst=st.dst)
                )
            else:
                s, ph = stage_of_piece[st.op]
                local = hplan.local.step_ops[i]
                self.items.append(_Item(i, local, st.keys, st.op.outputs, s, ph))
        # A conversion runs in the stage and phase of its first user.
        users: dict[Value, _Item] = {}
        for item in self.items:
            for k in item.keys:
                users.setdefault(k, item)
        for item in reversed(self.items):
            if item.op is None:
                user = users.get(item.outputs[0])
                if user is None:  # an output: the stage of its producer
                    user = next(x for x in self.items if item.keys[0] in x.outputs)
                item.stage, item.phase = user.stage, user.phase
        self.tasks: dict[tuple[int, str], list[_Item]] = {}
        for item in self.items:
            self.tasks.setdefault((item.stage, item.phase), []).append(item)
        if self.sequence_parallel:
            self._regather_for_backward()
        has_backward = any(ph == "B" for _, ph in self.tasks)
        self.sequences = [
            [
                (s, mb, ph)
                for s, mb, ph in _device_sequence(
                    schedule, d, self.pp, self.v, self.m, has_backward
                )
                if (s, ph) in self.tasks
            ]
            for d in range(self.pp)
        ]
        self.final = {k: hplan.current[k] for k in self.piece_out}

    def _regather_for_backward(self) -> None:
        """Sequence parallelism keeps a layer's input as token slices and all-gathers it
        again for the backward pass (Korthikanti et al. 2022, section 4.2.2) rather than
        keeping the gathered copy alive from forward to backward."""
        tokens = getattr(self.hplan.rule, "token_split", set())
        for item in self.items:
            if item.op is not None or item.phase != "F" or item.keys[0] not in tokens:
                continue
            if item.dst != R:
                continue
            task = self.tasks.get((item.stage, "B"), [])
            first = next((i for i, x in enumerate(task) if item.outputs[0] in x.keys), None)
            if first is None:
                continue
            again = _Item(item.index, None, item.keys, item.outputs, item.stage, "B", item.src, R)
            again.regather = True
            task.insert(first, again)

    def _gradients_in_weight_layout(self) -> None:
        """Each weight gradient the piece returns, converted to its weight's tensor-parallel
        layout (with sequence parallelism a layer norm's weight gradient is a partial sum
        over the token slices, a position embedding's is split by tokens)."""
        piece_inputs = {self.source_of[p]: p for p in self.piece.inputs}
        by_key = {k: p for p, k in self.key_of.items()}
        for op in self.post:
            w = self.post_keys[op][0]
            for k in self.post_keys[op][1:]:
                st = self.conv_dst.get(k)
                out = by_key.get(st.keys[0]) if st is not None else None
                if out is None or out not in self.hplan.current:
                    continue
                p = piece_inputs.get(w)
                want = (self.hplan.state.get(p) or R) if p is not None else R
                current = self.hplan.current[out]
                if self.hplan.state[current] != want:
                    self.hplan.current[out] = self.hplan.convert(current, want)

    def _token_shape(self) -> tuple[int, ...]:
        """The leading shape of the piece's activations: its integer batch input's (token
        ids or labels: ``(batch, seq)``), else the batch axis alone."""
        batch = [p for p in self.piece.inputs if self.dplan.state.get(self.source_of[p]) != R]
        ints = [p for p in batch if not p.type.dtype.is_float]
        if ints:
            return min((p.type.shape for p in ints), key=len)
        return batch[0].type.shape[:1]

    def _plan_zero(self) -> None:
        """For ZeRO: the axis along which each weight's optimizer state is split over the
        data-parallel replicas (None: the weight's state stays replicated)."""
        self.zero_dim: dict[Value, int | None] = {}  # weight -> axis of its tensor-local shard
        self.weight_of_grad: dict[Value, Value] = {}  # data-plan gradient key -> weight
        self.state_of: dict[Value, Value] = {}  # optimizer-state input -> its weight
        piece_inputs = {self.source_of[p]: p for p in self.piece.inputs}
        for op in self.post:
            keys = self.post_keys[op]
            w = keys[0]
            for k in keys[1:]:
                st = self.conv_dst.get(k)
                if st is not None:
                    self.weight_of_grad[st.keys[0]] = w
                elif k in self.t.inputs:
                    self.state_of[k] = w
            if not self.zero:
                continue
            p = piece_inputs.get(w)
            state = (self.hplan.state.get(p) or R) if p is not None else R
            local = self._local_type(w.type, state, 0)
            axes = [
                d
                for d in range(local.rank)
                if not (state.kind == "S" and d == state.dim) and local.shape[d] % self.dp == 0
            ]
            self.zero_dim[w] = axes[0] if axes else None

    def _zero_axis(self, weight: Value | None) -> int | None:
        return self.zero_dim.get(weight) if weight is not None else None

    # -- devices ---------------------------------------------------------------------------

    def devices(self, stage: int) -> list[int]:
        rank = stage % self.pp
        first = self.base + rank * self.n
        return list(range(first, first + self.n))

    def tp_groups(self) -> list[list[int]]:
        return [[i * self.tp + j for j in range(self.tp)] for i in range(self.dp)]

    def dp_groups(self) -> list[list[int]]:
        return [[i * self.tp + j for i in range(self.dp)] for j in range(self.tp)]

    def flat_type(self, local: TensorType, stage: int) -> TupleType:
        """``local`` on each device of ``stage``: made once per (type, pipeline rank), as
        a model's many equal weight and optimizer-state shards of a stage share it."""
        key = (local, stage % self.pp)
        found = self._flat.get(key)
        if found is None:
            found = TupleType(tuple(local.with_device(d) for d in self.devices(stage)))
            self._flat[key] = found
        return found

    # -- emission --------------------------------------------------------------------------

    def run(self) -> Function:
        t, hplan, dplan = self.t, self.hplan, self.dplan
        b = self.b = FunctionBuilder(t.name)
        self.vals: dict[tuple[Value, int, int], Value] = {}  # (key, microbatch, stage)
        self.made_on: dict[tuple[Value, int], int] = {}  # (key, microbatch) -> its stage
        self._bodies: dict[Value, Function] = {}  # gradient sums' bodies, by gradient
        self._runs: dict[tuple[_Item, ...], tuple] = {}  # each run of items: _body's answer
        self._first: dict[tuple, Op] = {}  # each repeated step's first op, by step
        self._flat: dict[tuple[TensorType, int], TupleType] = {}  # see flat_type
        self.acc: dict[Value, Value] = {}
        self.layouts: dict[str, tuple[str, ...]] = {}
        self.stage_of_key: dict[Value, int] = {}
        for item in self.items:
            for k in item.keys:
                self.stage_of_key.setdefault(k, item.stage)
        # Steady-state inputs: weights replicated over dp and laid out over tp on their
        # stage; batch inputs split into microbatches and replicas on their stage.
        self.inputs: dict[Value, Value] = {}
        self.weight_input: dict[Value, Value] = {}
        self.batch_split: dict[Value, Value] = {}
        piece_inputs = {self.source_of[p]: p for p in self.piece.inputs}
        self._items_reading: dict[Value, list[_Item]] = {}
        for item in self.items:
            for k in item.keys:
                self._items_reading.setdefault(k, []).append(item)
        post_users_of: dict[Value, list[Op]] = {}
        updating: dict[Value, list[Op]] = {}  # weight -> the optimizer steps that update it
        for op in self.post:
            for k in dict.fromkeys(self.post_keys[op]):
                post_users_of.setdefault(k, []).append(op)
            updating.setdefault(self.post_keys[op][0], []).append(op)
        post_states = self._post_states(piece_inputs)
        for v in t.inputs:
            p = piece_inputs.get(v)
            post_users = post_users_of.get(v, [])
            if p is None and not post_users:
                if v in t.outputs:
                    raise TransformError(f"input {v.name!r} is returned unchanged; not supported")
                continue
            if dplan.state[v] == R:
                stage = self._weight_stage(v, p, post_users)
                for op in updating.get(v, ()):
                    self.stage_of_post[op] = stage
                state = hplan.state.get(p, R) if p is not None else post_states.get(v, R)
                local = self._local_type(v.type, state, stage)
                dp_level = f"R@{self.dp}"
                zd = self._zero_axis(self.state_of.get(v)) if p is None else None
                if zd is not None:  # ZeRO: the replicas split the optimizer state
                    shape = list(local.shape)
                    shape[zd] //= self.dp
                    local = local.with_shape(tuple(shape))
                    dp_level = f"S({zd})@{self.dp}"
                x = b.input(v.name, self.flat_type(local, stage))
                self.layouts[v.name] = (dp_level, _level(state, self.tp))
                self.weight_input[v] = x
                if p is not None:
                    for mb in range(self.m):
                        self._put(p, mb, stage, x)
            else:
                stage = self.stage_of_key[p]
                state = hplan.state[p] if p is not None else R
                local = hplan.local.value(p).type.with_device(None)
                per_mb = self.flat_type(local, stage)
                x = b.input(v.name, TupleType((per_mb,) * self.m))
                self.layouts[v.name] = ("S(0)", f"S(0)@{self.dp}", _level(state, self.tp))
                for mb in range(self.m):
                    split = b.call("TupleGet", x, index=mb, name=f"{v.name}_mb{mb}")
                    self._put(p, mb, stage, split)
        self._merge()
        outs, out_layouts = self._optimizer_and_outputs()
        # (the builder has checked every op as it was added, and finish() the outputs)
        g = with_layouts(b.finish(outs), self.layouts, out_layouts)
        # Every device of a stage runs the same pmaps and takes part in the same grouped
        # collectives and sends: one rank class per pipeline rank.
        classes = tuple(tuple(self.devices(rank)) for rank in range(self.pp))
        return replace(g, rank_classes=tuple(c for c in classes if len(c) > 1))

    def _weight_stage(self, v: Value, p: Value | None, post_users: list[Op]) -> int:
        """The stage whose ops read weight ``v``; its optimizer steps run there too."""
        stages = set()
        if p is not None:
            stages |= {item.stage for item in self._items_reading.get(p, ())}
        if not stages:
            stages |= {self.stage_of_post[op] for op in post_users}
        if len(stages) > 1:
            raise TransformError(
                f"pipeline level: weight {v.name!r} is read by stages {sorted(stages)}; a "
                "weight shared between stages (tied embeddings) is not supported"
            )
        return stages.pop() if stages else 0

    def _post_states(self, piece_inputs: Mapping[Value, Value]) -> dict[Value, Shard]:
        """The tensor-parallel state of each optimizer operand: that of the weight of the
        first optimizer step reading it whose weight the piece reads (an optimizer-only
        input, Adam's moments say, is laid out as its weight)."""
        states: dict[Value, Shard] = {}
        for op in self.post:
            p = piece_inputs.get(self.post_keys[op][0])
            if p is not None:
                for k in self.post_keys[op]:
                    states.setdefault(k, self.hplan.state.get(p) or R)
        return states

    def _local_type(self, t: TensorType, state: Shard | None, stage: int) -> TensorType:
        if state is not None and state.kind == "S":
            n = t.shape[state.dim]
            if n % self.tp:
                raise TransformError(
                    f"tensor level: dim {state.dim} of size {n} does not split evenly "
                    f"over {self.tp} devices"
                )
            shape = list(t.shape)
            shape[state.dim] = n // self.tp
            t = t.with_shape(tuple(shape))
        return t.with_device(None)

    def _put(self, key: Value, mb: int, stage: int, value: Value) -> None:
        self.vals[(key, mb, stage)] = value
        self.made_on.setdefault((key, mb), stage)

    def value(self, key: Value, mb: int, stage: int) -> Value:
        """``key`` of microbatch ``mb`` on ``stage``'s devices (sent there once)."""
        if (key, mb, stage) in self.vals:
            return self.vals[(key, mb, stage)]
        home = self.made_on.get((key, mb))
        if home is None:
            raise TransformError(f"internal: {key.name} of microbatch {mb} is used before made")
        src = self.vals[(key, mb, home)]
        attributes = {"to_devices": self.devices(stage)}
        names = [f"{key.name}_mb{mb}_s{stage}"]
        (moved,) = self._add(("send", key, home, stage), "SendEach", [src], attributes, names)
        self.vals[(key, mb, stage)] = moved
        return moved

    def _merge(self) -> None:
        self._readers = self._items_reading  # the items that read each key
        self._kept = set(self.final.values()) | self.summed
        self._piece_of_final = {h: p for p, h in self.final.items()}
        producer: dict[Value, tuple[int, str]] = {}
        for key, items in self.tasks.items():
            for item in items:
                if item.regather:
                    continue
                for v in item.outputs:
                    producer[v] = key
        deps = {
            key: {producer[k] for it in items for k in it.keys if k in producer} - {key}
            for key, items in self.tasks.items()
        }
        run_schedule(self.sequences, deps, self._emit_task)

    def _emit_task(self, s: int, mb: int, phase: str) -> None:
        items = self.tasks[(s, phase)]
        run: list[_Item] = []
        for item in items:
            if item.op is None:
                self._emit_ops(run, s, mb)
                run = []
                self._emit_conversion(item, s, mb)
                continue
            run.append(item)
            # End the body where a gradient is complete, so that its all-reduce can start
            # while the rest of the backward pass runs.
            if mb == self.m - 1 and any(v in self.summed for v in item.outputs):
                self._emit_ops(run, s, mb)
                run = []
        self._emit_ops(run, s, mb)

    def _emit_ops(self, run: list[_Item], s: int, mb: int) -> None:
        if not run:
            return
        key = tuple(run)
        if key not in self._runs:  # the first microbatch to run these items
            self._runs[key] = self._body(run, s)
        inputs, results, body = self._runs[key]
        if not results:
            return
        operands = [self.value(k, mb, s) for k in inputs]
        names = [f"{v.name}_mb{mb}" for v in results]
        outs = self._add(("pmap", body), "Pmap", operands, {"device_var": _VAR}, names, body)
        for v, out in zip(results, outs):
            self._made(v, mb, s, out)

    def _add(
        self,
        step: tuple,
        op_type: str,
        inputs: list[Value],
        attributes: dict[str, Any],
        names: list[str],
        body: Function | None = None,
    ) -> tuple[Value, ...]:
        """Append an op; ``step`` names what it does (its body, conversion, gradient or
        transfer, which fix its attributes), and the same step of a later microbatch, on
        operands of the same types, is added like the first (typed once:
        ``FunctionBuilder.add_like``)."""
        first = self._first.get(step)
        if first is not None:
            return self.b.add_like(first, inputs, names).outputs
        bodies = [body] if body is not None else []
        op = self.b.add_op(op_type, inputs, attributes, names=names, subfunctions=bodies)
        self._first[step] = op
        return op.outputs

    def _body(self, run: list[_Item], s: int) -> tuple[list[Value], list[Value], Function | None]:
        """The keys ``run`` reads, those it makes that are used later, and its pmap body
        (None if nothing it makes is used): found once, shared by every microbatch that
        runs it (a stage's microbatches run the same ops on the same shapes)."""
        made = {v for item in run for v in item.outputs}
        inputs: list[Value] = []
        for item in run:
            for k in item.keys:
                if k not in made and k not in inputs:
                    inputs.append(k)
        later = self._used_later(run)
        results = [v for item in run for v in item.outputs if v in later]
        if not results:
            return inputs, results, None
        body_b = FunctionBuilder(f"{self.t.name}_s{s}")
        env: dict[Value, Value] = {}
        for k in inputs:
            env[k] = body_b.input(k.name, self.hplan.local.value(k).type)
        for item in run:
            outs = _copy_op(body_b, item.op, [env[k] for k in item.keys])
            for v, y in zip(item.outputs, outs):
                env[v] = y
        return inputs, results, body_b.finish([env[v] for v in results])

    def _used_later(self, run: list[_Item]) -> set[Value]:
        """The values ``run`` makes that an item outside it reads, or that are kept."""
        inside = set(run)
        return {
            v
            for item in run
            for v in item.outputs
            if v in self._kept or any(r not in inside for r in self._readers.get(v, ()))
        }

    def _made(self, v: Value, mb: int, s: int, out: Value) -> None:
        self._put(v, mb, s, out)
        piece_value = self._piece_of_final.get(v)
        if piece_value is None or piece_value not in self.summed:
            return
        if self.zero == 2:  # ZeRO-2: each microbatch's gradient reduce-scattered as made
            zd = self._zero_axis(self.weight_of_grad.get(self.dplan_source(piece_value)))
            if zd is not None:
                attributes = {"dim": zd, "op": "sum", "groups": self.dp_groups()}
                names = [f"{v.name}_mb{mb}_dp"]
                (out,) = self._add(("zero2", v), "ReduceScatter", [out], attributes, names)
        prev = self.acc.get(v)
        if prev is not None:
            out = self._pmap_add(prev, out, v, mb)
        self.acc[v] = out
        if mb == self.m - 1:
            self._reduce_gradient(v, s)

    def _pmap_add(self, a: Value, x: Value, v: Value, mb: int) -> Value:
        body = self._bodies.get(v)
        if body is None:  # one per gradient, shared by its microbatches (of one shape)
            elem = a.type.elements[0].with_device(DeviceVar(_VAR))
            body_b = FunctionBuilder(f"{v.name}_acc")
            p = body_b.input(f"{v.name}_acc", elem)
            q = body_b.input(v.name, elem)
            body = body_b.finish(body_b.call("Add", p, q, name=f"{v.name}_sum"))
            self._bodies[v] = body
        names = [f"{v.name}_acc{mb}"]
        return self._add(("pmap", body), "Pmap", [a, x], {"device_var": _VAR}, names, body)[0]

    def _reduce_gradient(self, v: Value, s: int) -> None:
        """All-reduce a weight gradient among the replicas holding the same shard (ZeRO-1:
        reduce-scatter it, each replica keeping the part its optimizer-state shard updates;
        ZeRO-2 has reduce-scattered every microbatch's already)."""
        piece_value = self._piece_of_final[v]  # each piece output has its own final value
        source = self.dplan_source(piece_value)
        if source is None or self.dp == 1:
            return
        zd = self._zero_axis(self.weight_of_grad.get(source))
        if zd is None:
            self.acc[v] = self.b.call(
                "AllReduce", self.acc[v], op="sum", groups=self.dp_groups(), name=f"{v.name}_dp"
            )
        elif self.zero == 1:
            self.acc[v] = self._reduce_scatter(self.acc[v], zd, f"{v.name}_dp")

    def _reduce_scatter(self, x: Value, zd: int, name: str) -> Value:
        return self.b.call("ReduceScatter", x, dim=zd, op="sum", groups=self.dp_groups(), name=name)

    def dplan_source(self, piece_value: Value) -> Value | None:
        """The data-plan key a piece output stands for, if it is converted (a gradient)."""
        key = self.key_of.get(piece_value)
        return key if key is not None and key in self._summed_sources else None

    def _emit_conversion(self, item: _Item, s: int, mb: int) -> None:
        src, dst = item.src, item.dst
        xs = self.value(item.keys[0], mb, s)
        names = [f"{item.outputs[0].name}_mb{mb}"]
        groups = self.tp_groups()
        if dst == R and src.kind == "S":
            op_type, attributes = "AllGather", {"dim": src.dim, "groups": groups}
        elif dst == R and src == P:
            op_type, attributes = "AllReduce", {"op": "sum", "groups": groups}
        elif dst.kind == "S" and src == P:
            op_type, attributes = "ReduceScatter", {"dim": dst.dim, "op": "sum", "groups": groups}
        elif dst.kind == "S" and src == R:  # into a sequence-parallel region: no transfer
            op_type, attributes = "KeepShard", {"dim": dst.dim, "groups": groups}
        else:
            raise TransformError(
                f"tensor level: no grouped collective turns {src} into {dst} ({item.keys[0].name})"
            )
        (out,) = self._add(("conversion", item, s), op_type, [xs], attributes, names)
        self._made(item.outputs[0], mb, s, out)

    # -- optimizer and outputs -------------------------------------------------------------

    def _optimizer_and_outputs(self) -> tuple[list[Value], list]:
        t, dplan = self.t, self.dplan
        self._post_making: dict[Value, Op] = {}  # each optimizer result -> its step
        for op in self.post:
            for out in op.outputs:
                self._post_making.setdefault(out, op)
        glob: dict[Value, Value] = {}
        final_piece_of = {k: p for p, k in self.key_of.items() if p in self.final}
        for dst, st in self.conv_dst.items():
            src = st.keys[0]
            piece_value = final_piece_of.get(src)
            if piece_value is None:
                continue
            h = self.final[piece_value]
            if st.src == P:
                glob[dst] = self.acc[h]
        for v in t.inputs:
            if v in self.weight_input:
                glob[v] = self.weight_input[v]
                zd = self._zero_axis(v)
                if zd is not None:  # ZeRO: each replica updates its part of the weight
                    glob[v] = self.b.call(
                        "KeepShard", glob[v], dim=zd, groups=self.dp_groups(), name=f"{v.name}_z"
                    )
        by_stage: dict[int, list[Op]] = {}
        for op in self.post:
            by_stage.setdefault(self.stage_of_post[op], []).append(op)
        for s, ops in sorted(by_stage.items()):
            inputs: list[Value] = []
            made: set[Value] = set()
            for op in ops:
                for k in self.post_keys[op]:
                    if k not in made and k not in inputs:
                        inputs.append(k)
                made.update(op.outputs)
            body_b = FunctionBuilder(f"{t.name}_update_s{s}")
            env = {
                k: body_b.input(k.name, glob[k].type.elements[0].with_device(DeviceVar(_VAR)))
                for k in inputs
            }
            for op in ops:
                ins = [env[k] for k in self.post_keys[op]]
                outs = localize_op(body_b, op, ins, DeviceVar(_VAR))
                env.update(zip(op.outputs, outs))
            results = [v for op in ops for v in op.outputs]
            body = body_b.finish([env[v] for v in results])
            pm = self.b.add_op(
                "Pmap",
                [glob[k] for k in inputs],
                {"device_var": _VAR},
                names=[v.name for v in results],
                subfunctions=[body],
            )
            glob.update(zip(results, pm.outputs))
            for op in ops:  # ZeRO: the replicas gather the updated parts of each weight
                zd = self._zero_axis(self.post_keys[op][0])
                if zd is not None:
                    w1 = op.outputs[0]
                    glob[w1] = self.b.call(
                        "AllGather", glob[w1], dim=zd, groups=self.dp_groups(), name=w1.name
                    )
        outs, layouts = [], []
        for v in t.outputs:
            key = dplan.current[v]
            if key in glob:
                outs.append(glob[key])
                layouts.append(self._update_layout(key))
                continue
            piece_value = next(p for p in self.piece_out if self._piece_key(p) is key)
            h = self.final[piece_value]
            hstate = self.hplan.state[h]
            if piece_value in self.summed:
                outs.append(self.acc[h])
                layouts.append((self._summed_level(piece_value), _level(hstate, self.tp)))
            else:
                per_mb = [self.vals[(h, mb, self.made_on[(h, mb)])] for mb in range(self.m)]
                outs.append(self.b.call("MakeTuple", *per_mb, name=v.name))
                layouts.append(("S(0)", f"S(0)@{self.dp}", _level(hstate, self.tp)))
        return outs, layouts

    def _summed_level(self, piece_value: Value) -> str:
        """The data level of an output summed over microbatches: a weight gradient is
        all-reduced among the replicas (``R``) or, under ZeRO, reduce-scattered
        (``S(k)``), as ``_reduce_gradient`` does; anything else (the loss) stays their
        partial sums (``P``). Fuzzing found gradients returned (``return_gradients``)
        labelled ``P``: ``ir.collect`` summed dp full copies, dp times the gradient."""
        source = self.dplan_source(piece_value)
        if source is None or self.dp == 1:
            return f"P@{self.dp}"
        zd = self._zero_axis(self.weight_of_grad.get(source))
        return f"R@{self.dp}" if zd is None else f"S({zd})@{self.dp}"

    def _update_layout(self, key: Value) -> tuple[str, ...] | None:
        """The layout of an optimizer result: that of the input it is the next step's
        value of (result 0 the parameter, then the state operands in order)."""
        op = self._post_making.get(key)
        if op is None:
            return None
        opdef = get_op(op.op_type)
        updated = [0, *(opdef.operands.index(n) for n in opdef.extra.get("state", ()))]
        i = op.outputs.index(key)
        source = self.post_keys[op][updated[i]] if i < len(updated) else self.post_keys[op][0]
        return self.layouts.get(source.name)

    def _piece_key(self, p: Value) -> Value | None:
        return self.key_of.get(p)


def megatron(
    t: Function,
    dp: int = 1,
    tp: int = 1,
    pp: int = 1,
    microbatches: int = 1,
    schedule: str = "1f1b",
    *,
    chunks: int = 1,
    zero: int = 0,
    sequence_parallel: bool = False,
    devices: Sequence[int] | None = None,
    topology: Any = None,
    stage_of: Mapping[str, int] | None = None,
) -> Function:
    """``t`` (a training or forward program on one device) as a 3D-parallel steady-state step
    on ``dp * tp * pp`` devices (see the module docstring).

    ``schedule``: ``"gpipe"``, ``"1f1b"`` or ``"interleaved"`` (``chunks`` model chunks
    per pipeline rank, microbatches a multiple of ``pp``). ``zero``: 0, 1 or 2, the ZeRO
    stage of the data level; ``sequence_parallel``: Megatron sequence parallelism at
    the tensor level. ``devices``: the first device id is the base of the numbering
    (default 0). ``stage_of={value_name: stage}`` or ``PipelineStage`` annotations in
    ``t``: the stages (``ir.transforms.stage_cut``).
    """
    check_common("megatron", t, topology, "t")
    sequence_parallel = bool_arg("megatron", "sequence_parallel", sequence_parallel)
    dp = _positive("the data-parallel degree (dp)", dp)
    tp = _positive("the tensor-parallel degree (tp)", tp)
    pp = _positive("the pipeline degree (pp)", pp)
    m = _positive("microbatches", microbatches)
    chunks = _positive("chunks", chunks)
    if not isinstance(schedule, str) or schedule not in SCHEDULES:
        raise TransformError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if chunks > 1 and schedule != "interleaved":
        raise TransformError(f"chunks={chunks} needs schedule='interleaved', got {schedule!r}")
    if schedule == "interleaved" and m % pp:
        raise TransformError(
            f"pipeline level: the interleaved schedule takes microbatches in groups of the "
            f"{pp} stages; {m} is not a multiple of {pp}"
        )
    total = dp * tp * pp
    ids = check_devices(devices, total, topology, what="number of devices (dp x tp x pp)")
    base = ids[0]
    if list(ids) != list(range(base, base + total)):
        raise TransformError(f"devices must be consecutive ids, got {list(ids)}")
    if isinstance(zero, bool) or not isinstance(zero, int) or zero not in (0, 1, 2):
        raise TransformError(f"zero must be 0, 1 or 2 (the ZeRO stage), got {zero!r}")
    return _Megatron(
        t, dp, tp, pp, m, schedule, chunks, base, zero, sequence_parallel, stage_of
    ).run()


def gradient_accumulation(
    t: Function,
    steps: int,
    *,
    dp: int = 1,
    tp: int = 1,
    zero: int = 0,
    sequence_parallel: bool = False,
    devices: Sequence[int] | None = None,
    topology: Any = None,
) -> Function:
    """``t``'s step with its batch run as ``steps`` microbatches one after another, each
    one's forward then its backward, the weight gradients summed before one optimizer
    step: the activations of one microbatch live at a time (the one-stage 1F1B
    schedule of :func:`megatron`, whose other options it takes).

    >>> import ir
    >>> from ir.transforms import gradient_accumulation, training
    >>> t = training(ir.models.mlp(8, 4, 4, 2, layers=2))
    >>> g = gradient_accumulation(t, 4)
    >>> g.input_layouts[-1]  # the batch arrives as 4 microbatches (of one replica)
    ('S(0)', 'S(0)@1', 'R@1')
    """
    check_common("gradient_accumulation", t, topology, "t")
    steps = _positive("steps", steps)
    return megatron(
        t,
        dp,
        tp,
        1,
        steps,
        "1f1b",
        zero=zero,
        sequence_parallel=sequence_parallel,
        devices=devices,
        topology=topology,
    )


def tensor_split_problem(t: Function, tp: int) -> str | None:
    """Why :func:`megatron` cannot split any weight of ``t`` (a training or forward
    program) over ``tp`` tensor-parallel ranks, or None if it can (or ``tp`` is 1).

    Only the analysis runs (the data and tensor plans of one replica, one stage, one
    microbatch): no program is built. Other problems are not this function's to report.

    >>> import ir
    >>> from ir.transforms import training
    >>> one_layer = training(ir.models.mlp(8, 4, 4, 2, layers=1))
    >>> print(tensor_split_problem(one_layer, 2).split(" (")[0])
    tensor level: no weight of mlp splits 2 ways
    >>> tensor_split_problem(training(ir.models.mlp(8, 4, 4, 2, layers=2)), 2) is None
    True
    """
    tp = _positive("the tensor-parallel degree (tp)", tp)
    try:
        _Megatron(t, 1, tp, 1, 1, "1f1b", 1, 0)
    except TensorSplitError as e:
        return str(e)
    except TransformError:
        return None  # another level's problem: the strategies that meet it say it
    return None


__all__ = ["TensorSplitError", "gradient_accumulation", "megatron", "tensor_split_problem"]
