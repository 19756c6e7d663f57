"""The analysis behind :func:`ir.transforms.megatron`: what a 3D step runs where.

The data plan over ``dp * microbatches`` pieces gives the per-piece program (global
loss denominators), the gradients it leaves partial and the optimizer steps after
their all-reduce; the tensor-parallel plan of the piece gives its items (local ops and
grouped conversions), each in a pipeline stage and phase (forward or backward); ZeRO
picks the axis each weight's optimizer state splits along. Devices are numbered as
Megatron-LM numbers ranks (see :mod:`ir.transforms.megatron`). Nothing is emitted
here: :mod:`ir.transforms._megatron_stages` and :mod:`ir.transforms._megatron_update`
write the program.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from ..function import Function
from ..op import Op
from ..registry import get_op
from ..sharding.facts import ProgramFacts
from ..types import TensorType
from ..value import Value
from ._megatron_mesh import StageMesh
from ._megatron_piece import analyse_pieces
from ._megatron_shared import SharedAnalyses
from ._rewrite import TransformError, batch_inputs, batch_size, returned_inputs_copied
from ._rules import data_rule, distinct_ops, split_signature
from ._spmd import P, R, Shard
from ._spmd import Plan as _Plan
from .horizontal import check_heads, horizontal_plan
from .pipeline import device_groups
from .stage_cut import annotated_stages, pipeline_degree, staged
from .tensor_limits import TensorReplicationError, replicated_split
from .vocab_parallel import undivided_vocabulary, vocabulary_form, vocabulary_rewrites

T = TypeVar("T")
VAR = "e"  # the device variable of every pmap body of the step


def level(state: Shard | None, n: int) -> str:
    if state is None or state == R:
        return f"R@{n}"
    return f"P@{n}" if state == P else f"S({state.dim})@{n}"


@dataclass(eq=False)
class Item:
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
    level: str = "tp"  # the mesh axis a conversion runs over (see :meth:`MegatronPlan.groups`)
    shift: int = 0  # a ring step: the block of the member this many places back (Link.shift)


class TensorSplitError(TransformError):
    """Tensor parallelism over the asked ranks splits no weight of the program."""


def _distinct(piece: Function) -> tuple[ProgramFacts, list[Op]]:
    """The piece's op facts (signatures, read once by all its plans) and one op of each
    signature (whose candidates the tensor plans' sharing compares)."""
    facts = ProgramFacts(piece)
    return facts, distinct_ops(facts)


class MegatronPlan(StageMesh):
    """The analysis of ``t`` as a 3D step (see the module doc); raises a TransformError
    naming the level (data, tensor, pipeline) whose limit ``t`` meets."""

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
        allow_replication: bool = False,
        vocab_parallel: bool = True,
        ep: int = 1,
        cp: int = 1,
        ring_attention: bool = True,
        shared: SharedAnalyses | None = None,
        checks_only: bool = False,
    ) -> None:
        source, vocabulary = t, vocab_parallel and tp > 1
        if shared is not None and shared.program is not source:
            raise TransformError("shared analyses of another program: make one per program")
        self._shared = shared
        # checks_only: the analysis up to the tensor level's checks (what a tensor degree
        # cannot split or would repeat), not what a build reads
        self._checks_only = checks_only
        # the program's form: embeddings and cross-entropies split by vocabulary, keyed by
        # the ops rewritten (the same form for every degree that rewrites the same ops)
        self._form: tuple = ("form", ())
        if vocabulary:
            t = self._vocabulary_form(source, tp, frozenset())
        self.t, self.dp, self.tp, self.pp, self.m = t, dp, tp, pp, m
        self.ep, self.cp, self.ring_attention = ep, cp, ring_attention
        self.allow_replication = allow_replication
        self.sequence_parallel = sequence_parallel and tp > 1
        self.stage_of = stage_of
        self.v, self.n = chunks, dp * cp * tp
        self._groups: dict[tuple[str, ...], list[list[int]]] = {}
        self.stages = pp * chunks
        self.base = base
        self.zero = zero if dp > 1 else 0
        self._analyse()
        problem = undivided_vocabulary(source, tp) if vocabulary else None
        if problem is not None and not allow_replication:
            raise TensorReplicationError(problem)
        whole = self._whole_logits() if vocabulary else set()
        if whole:  # a cross-entropy of logits the plan keeps whole: as it was, unsplit
            self.t = self._vocabulary_form(source, tp, frozenset(whole))
            self._analyse()
        if checks_only:  # the tensor level's checks answered: the items change none
            return
        self._itemize(schedule)
        self._plan_zero()
        if self.zero == 3:
            from ._megatron_zero3 import plan_zero3

            plan_zero3(self)

    # -- analysis --------------------------------------------------------------------------

    def _share(self, key: tuple, make: Callable[[], T]) -> T:
        """``make()``, or the search's shared result of the same key (see
        :mod:`ir.transforms._megatron_shared`)."""
        return make() if self._shared is None else self._shared.get(key, make)

    def _vocabulary_form(self, source: Function, tp: int, keep: frozenset[str]) -> Function:
        """``source`` in its vocabulary-parallel form for ``tp`` (``keep``: the logits whose
        cross-entropy stays whole), and its key in ``self._form``."""
        rewrites = vocabulary_rewrites(source, tp, keep)
        self._form = ("form", rewrites)
        if not rewrites:
            return source
        return self._share(self._form, lambda: vocabulary_form(source, tp, keep))

    def _analyse(self) -> None:
        """The data and tensor plans of ``self.t`` (the program in form ``self._form``)."""
        form, start = self._form, self.t
        self.t = self._share((form, "copied"), lambda: returned_inputs_copied(start))
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
        # The pipeline stages of t's ops, each stage's replays started from what it holds
        # (stage_cut.staged: t may change where a cut falls inside a recomputed layer).
        what = pipeline_degree(self.pp, self.v)
        cut = tuple(sorted(self.stage_of.items())) if self.stage_of is not None else None
        cut_key = (form, "staged", self.stages, what, cut)
        unstaged = t
        t, stage_of_op = self._share(
            cut_key,
            lambda: staged(unstaged, self.stages, annotated_stages(unstaged, self.stage_of), what),
        )
        self.t = t
        # The data level: the same for every strategy of as many pieces of this program
        # (the form's own when the cut changed none of its ops).
        program = form if t is unstaged else cut_key
        piece_key = (program, "pieces", dp * m, self.ep)
        pieces = self._share(piece_key, lambda: analyse_pieces(t, dp * m, self.ep))
        self.dplan = pieces.dplan
        self.post = pieces.post
        self.post_keys = pieces.post_keys
        self.conv_dst = pieces.conv_dst
        self._summed_sources = pieces.summed_sources
        self.piece = pieces.piece
        self.source_of = pieces.source_of
        self.key_of = pieces.key_of
        self.piece_out = pieces.piece_out
        self.summed = pieces.summed
        # Stages (of the source program's ops) of the piece's ops.
        backward = pieces.backward
        stage_of_piece = {
            op: (stage_of_op[source], "B" if source in backward else "F")
            for op, source in pieces.origin
        }
        self.stage_of_post = {op: stage_of_op[op] for op in self.post}
        # The context and expert levels (_megatron_levels), between the data and tensor ones.
        self.links: dict = {}
        self.experts: set[Value] = set()
        self.level_states: dict[str, dict[Value, Shard]] = {}
        self._stage_of_piece = self._plan_levels(stage_of_piece)
        self._piece_share = piece_key
        if self._checks_only:  # the checks read the (shared) plan's states only
            self.hplan = self._tensor_plan(read_only=True)
        elif self.cp > 1 or self.ep > 1 or self.zero == 3:  # levels or ZeRO-3 change it
            self.hplan = self._tensor_plan()
        else:  # the same for every strategy of this tensor level and pieces
            key = (piece_key, "tensor", self.tp, self.sequence_parallel, self.allow_replication)
            self.hplan = self._share(key, self._tensor_plan)

    def _tensor_plan(self, read_only: bool = False) -> _Plan:
        """The tensor-parallel plan of the piece, each weight gradient it returns in its
        weight's layout; raises if ``tp`` splits nothing or (unless allowed) repeats work
        (``read_only``: the checks only, on a plan that may be shared, left as it is)."""
        t = self.t
        if self.tp > 1:
            lead = self._token_shape() if self.sequence_parallel else None
            if lead is not None and lead[-1] % self.tp:
                # one pmap body serves every tensor-parallel rank: the blocks must be equal
                raise TransformError(
                    f"sequence parallelism splits the {lead[-1]} tokens along axis "
                    f"{len(lead) - 1} of {t.name}'s activations {self.tp} ways; give a length "
                    f"divisible by tp={self.tp} (or sequence_parallel=False)"
                )
            hplan = self._horizontal(self.tp, lead, read_only=read_only)
            if not any(s is not None and s.kind == "S" for s in hplan.state.values()):
                raise TensorSplitError(
                    f"tensor level: no weight of {t.name} splits {self.tp} ways (tensor "
                    "parallelism splits MatMul pairs, attention heads and vocabularies)"
                )
            if not self.allow_replication:  # past the heads (or any split's axis)?
                structure = self._horizontal(1, None, read_only=True)
                problem = replicated_split(self.piece, hplan, structure, self.tp)
                if problem is not None:
                    raise TensorReplicationError(problem)
        else:
            hplan = _Plan(self.piece, 1, {}, data_rule, VAR, self.links)
        if not read_only:
            self._gradients_in_weight_layout(hplan)
        return hplan

    def _horizontal(
        self, degree: int, lead: tuple[int, ...] | None, read_only: bool = False
    ) -> _Plan:
        """The tensor-parallel plan of the piece over ``degree`` ranks (``horizontal_plan``;
        ``lead``: sequence parallelism's). With shared analyses, the degrees whose splits
        divide alike (the same ways to run every op: ``split_signature``) share one plan's
        decisions, each degree its own local program (``Plan.at_degree``; ``read_only``:
        the shared plan itself, for a caller that reads its states only)."""
        shared = self._shared is not None and not self.links and self.ep == self.cp == 1
        if not shared:
            return horizontal_plan(
                self.piece,
                degree,
                VAR,
                sequence=lead,
                allow_replication=self.allow_replication,
                links=self.links,
            )
        piece, key = self.piece, self._piece_share
        facts, ops = self._share((key, "ops"), lambda: _distinct(piece))

        def planned() -> _Plan:
            return horizontal_plan(
                piece, degree, VAR, sequence=lead, allow_replication=True, facts=facts
            )

        decided = self._share((key, "split", split_signature(ops, degree), lead), planned)
        plan = decided
        if decided.shaped:  # decisions of that degree only (never so far): plan this one
            plan = planned()
        elif not read_only:
            plan = decided.at_degree(degree)
        if degree > 1 and not self.allow_replication:
            check_heads(plan, degree)  # as horizontal_plan checks its own
        return plan

    def _itemize(self, schedule: str) -> None:
        """The plan's items in their stages and phases, each (stage, phase) task's items,
        and each pipeline rank's sequence of tasks under ``schedule``."""
        hplan, stage_of_piece = self.hplan, self._stage_of_piece
        self.items: list[Item] = []
        for i, st in enumerate(hplan.steps):
            if st.op is None and st.link is not None:  # a conversion of another level
                link = st.link
                keys, outs = (st.keys[0],), (st.keys[1],)
                item = Item(i, None, keys, outs, src=link.src_state, dst=link.dst_state)
                item.level, item.shift = link.level, link.shift
                self.items.append(item)
            elif st.op is None:
                self.items.append(
                    Item(i, None, (st.keys[0],), (st.keys[1],), src=st.src, dst=st.dst)
                )
            else:
                s, ph = stage_of_piece[st.op]
                local = hplan.local.step_ops[i]
                self.items.append(Item(i, local, st.keys, st.op.outputs, s, ph))
        # A conversion runs in the stage and phase of the user that runs first: forwards in
        # stage order, then backwards in reverse stage order (the first user in the
        # program's order may be a backward of an earlier stage, which runs after the
        # others that would then wait for it: a residual's gradient summed on one stage
        # and read by the branch on the next).
        users: dict[Value, list[Item]] = {}
        makers: dict[Value, Item] = {}
        for item in self.items:
            for k in item.keys:
                users.setdefault(k, []).append(item)
            for v in item.outputs:
                makers.setdefault(v, item)

        def runs_first(item: Item) -> tuple[bool, int]:
            backward = item.phase == "B"
            return backward, -item.stage if backward else item.stage

        for item in reversed(self.items):
            if item.op is None:
                found = users.get(item.outputs[0])
                # an output: the stage of its producer
                user = min(found, key=runs_first) if found else makers[item.keys[0]]
                item.stage, item.phase = user.stage, user.phase
        self.tasks: dict[tuple[int, str], list[Item]] = {}
        for item in self.items:
            self.tasks.setdefault((item.stage, item.phase), []).append(item)
        if self.sequence_parallel:
            self._regather_for_backward()
        has_backward = any(ph == "B" for _, ph in self.tasks)
        # each device's tasks between its exchanges with its neighbours (device_groups)
        self.exchange_groups = [
            [
                kept
                for group in device_groups(schedule, d, self.pp, self.v, self.m, has_backward)
                if (kept := [(s, mb, ph) for s, mb, ph in group if (s, ph) in self.tasks])
            ]
            for d in range(self.pp)
        ]
        self.sequences = [[t for g in groups for t in g] for groups in self.exchange_groups]
        self.final = {k: hplan.current[k] for k in self.piece_out}
        self.piece_input_of = {
            self.source_of[p]: p for p in self.piece.inputs if p in self.source_of
        }

    def _whole_logits(self) -> set[str]:
        """The logits whose vocabulary-parallel cross-entropy the tensor plan runs whole
        (their head is not split by classes: the layer before split it by rows)."""
        whole = set()
        for st in self.hplan.steps:
            extra = get_op(st.op.op_type).extra if st.op is not None else {}
            index = extra.get("index_operands", ())
            if not index or "weight_operands" in extra or not st.keys[0].type.dtype.is_float:
                continue  # not a cross-entropy's op (an embedding's: its table is operand 0)
            if self.hplan.state.get(st.keys[index[0]]) in (R, None):
                whole.add(st.op.inputs[0].name)
        return whole

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
            again = Item(item.index, None, item.keys, item.outputs, item.stage, "B", item.src, R)
            again.regather = True
            task.insert(first, again)

    def _gradients_in_weight_layout(self, hplan: _Plan) -> None:
        """Each weight gradient the piece returns, converted in ``hplan`` to its weight's
        tensor-parallel layout (with sequence parallelism a layer norm's weight gradient is
        a partial sum over the token slices, a position embedding's is split by tokens)."""
        piece_inputs = {self.source_of[p]: p for p in self.piece.inputs if p in self.source_of}
        by_key = {k: p for p, k in self.key_of.items()}
        for op in self.post:
            w = self.post_keys[op][0]
            for k in self.post_keys[op][1:]:
                st = self.conv_dst.get(k)
                out = by_key.get(st.keys[0]) if st is not None else None
                if out is None or out not in hplan.current:
                    continue
                p = piece_inputs.get(w)
                want = (hplan.state.get(p) or R) if p is not None else R
                current = hplan.current[out]
                if hplan.state[current] != want:
                    hplan.current[out] = hplan.convert(current, want)

    def _token_shape(self) -> tuple[int, ...]:
        """The leading shape of the piece's activations: its integer batch input's (token
        ids or labels: ``(batch, seq)``), else the batch axis alone."""
        batch = [
            p
            for p in self.piece.inputs
            if p in self.source_of and self.dplan.state.get(self.source_of[p]) != R
        ]
        ints = [p for p in batch if not p.type.dtype.is_float]
        if ints:
            return min((p.type.shape for p in ints), key=len)
        return batch[0].type.shape[:1]

    def _plan_zero(self) -> None:
        """Each weight's gradient group (``weight_group``: the replicas that sum its
        gradient) and, for ZeRO, the axis along which the group splits its optimizer state
        (None: the weight's state stays replicated)."""
        self.zero_dim: dict[Value, int | None] = {}  # weight -> axis of its tensor-local shard
        self.weight_of_grad: dict[Value, Value] = {}  # data-plan gradient key -> weight
        self.state_of: dict[Value, Value] = {}  # optimizer-state input -> its weight
        self.weight_group: dict[Value, str] = {}  # weight -> the group summing its gradient
        piece_inputs = self.piece_inputs()
        by_key = {k: p for p, k in self.key_of.items() if p in self.summed}
        inputs = set(self.t.inputs)
        for op in self.post:
            keys = self.post_keys[op]
            w = keys[0]
            self.weight_group.setdefault(w, "dp")
            for k in keys[1:]:
                st = self.conv_dst.get(k)
                if st is not None:
                    self.weight_of_grad[st.keys[0]] = w
                    out = by_key.get(st.keys[0])
                    if out is not None:
                        self.weight_group[w] = self.grad_level(out)
                elif k in inputs:
                    self.state_of[k] = w
            if not self.zero:
                continue
            p = piece_inputs.get(w)
            state = (self.hplan.state.get(p) or R) if p is not None else R
            local = self.weight_local(w)
            size = self.group_size(self.weight_group[w])
            axes = [
                d
                for d in range(local.rank)
                if not (state.kind == "S" and d == state.dim)
                and not (d == 0 and p in self.experts)  # split by experts already
                and local.shape[d] % size == 0
            ]
            self.zero_dim[w] = axes[0] if axes else None

    def piece_inputs(self) -> dict[Value, Value]:
        """Data-plan key -> the piece input it becomes (inputs made by another level's
        conversion have none)."""
        return self.piece_input_of

    def weight_local(self, w: Value) -> TensorType:
        """The part of weight ``w`` (an input of the program) one device holds before
        ZeRO: split over the tensor ranks and, for an expert weight, the expert group."""
        p = self.piece_inputs().get(w)
        if p is None:
            return self._local_type(w.type, R, 0)
        self._local_type(w.type, self.hplan.state.get(p) or R, 0)  # tp must split it evenly
        local = self.hplan.local.value(p).type
        assert isinstance(local, TensorType)
        return local.with_device(None)

    def is_expert(self, w: Value) -> bool:
        return self.piece_inputs().get(w) in self.experts

    def _zero_axis(self, weight: Value | None) -> int | None:
        return self.zero_dim.get(weight) if weight is not None else None

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

    # -- devices ---------------------------------------------------------------------------

    def devices(self, stage: int) -> list[int]:
        rank = stage % self.pp
        first = self.base + rank * self.n
        return list(range(first, first + self.n))
