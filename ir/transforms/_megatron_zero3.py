"""ZeRO stage 3 (fully sharded data parallelism) in :func:`ir.transforms.megatron`'s plan.

Under ``zero=3`` (Rajbhandari et al. 2020, section 5.3; PyTorch's FSDP) the replicas of
a weight hold a part each, like its optimizer state under stages 1 and 2: the step's
weight input is laid out ``S(k)@dp`` and no replica keeps the whole weight between
uses. Each task (a stage's forward or backward of one microbatch) all-gathers the
weights it reads just before it needs them and lets them go after their last use
(liveness frees them); the backward gathers them again. Gradients are reduce-scattered
as each microbatch makes them (as ZeRO-2 does), each replica updates its part, and the
updated parts stay where they are: the next step starts from them.

The gathers follow the model's units, its sublayers (``layer_cut.cut_points``: the
points one activation alone crosses), as FSDP wraps a transformer's blocks: the first
two units' weights are gathered as the task starts and each further unit's while the
unit before it computes (prefetch of the next unit, FSDP's ``forward_prefetch`` /
``backward_prefetch``), so at most about two units are gathered at a time. The
simulator starts a transfer as soon as its operand is ready, so the prefetch is written
as data: the gather of unit ``k`` reads its parts through a view (``Reshape`` to the
same shape, which launches no kernel) taken at the end of the run of ops before unit
``k - 1``, and so cannot start before that run ends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..builder import FunctionBuilder
from ..types import DeviceVar, TensorType
from ..value import Value
from ._spmd import R, S
from .layer_cut import cut_points
from .pipeline import backward_ops
from .step_parts import weights

if TYPE_CHECKING:
    from ._megatron_plan import Item, MegatronPlan


def units_of(plan: MegatronPlan) -> dict[Value, int]:
    """Each weight of the plan's program -> its unit (sublayer), in order of first use."""
    t = plan.t
    order = weights(t)
    points = cut_points(t, backward_ops(t), order).points
    unit: dict[Value, int] = {}
    k = 0
    for i, w in enumerate(order):
        while k < len(points) and points[k] <= i:
            k += 1
        unit[w] = k
    return unit


def plan_zero3(plan: MegatronPlan) -> None:
    """Add ZeRO-3's weight gathers (and the views that order them) to ``plan``'s tasks;
    ``plan.zero3_shard`` maps each gathered piece input to the key of its part."""
    from ._megatron_plan import Item

    piece_inputs = plan.piece_inputs()
    local = plan.hplan.local
    plan.zero3_shard: dict[Value, Value] = {}
    shard_dim: dict[Value, int] = {}
    group_of: dict[Value, str] = {}  # piece input -> the group splitting it
    for w, zd in plan.zero_dim.items():
        p = piece_inputs.get(w)
        if zd is None or p is None:
            continue
        whole = local.value(p).type
        assert isinstance(whole, TensorType)
        shape = list(whole.shape)
        group_of[p] = plan.weight_group[w]
        shape[zd] //= plan.group_size(group_of[p])
        shard = Value(f"{p.name}_part", p.type)
        local.env[shard] = local.b.input(shard.name, whole.with_shape(tuple(shape)))
        plan.zero3_shard[p] = shard
        shard_dim[p] = zd
    if not plan.zero3_shard:
        return
    unit_of_source = units_of(plan)
    unit_of = {p: unit_of_source.get(plan.source_of[p], 0) for p in plan.zero3_shard}
    added: list[Item] = []
    for (s, phase), items in plan.tasks.items():
        first: dict[Value, int] = {}
        for i, item in enumerate(items):
            for k in item.keys:
                if k in plan.zero3_shard:
                    first.setdefault(k, i)
        if not first:
            continue
        units: dict[int, list[Value]] = {}
        for p in sorted(first, key=first.__getitem__):
            units.setdefault(unit_of[p], []).append(p)
        order = list(units)  # by first use in this task
        start = {u: min(first[p] for p in units[u]) for u in order}
        before: dict[int, list[Item]] = {}

        def gather(p: Value, key: Value, s: int = s, phase: str = phase) -> Item:
            zd, group = shard_dim[p], group_of[p]
            return Item(-1, None, (key,), (p,), s, phase, S(zd), R, regather=True, level=group)

        for k, u in enumerate(order):
            if k < 2:
                at = start[order[0]]
                before.setdefault(at, []).extend(gather(p, plan.zero3_shard[p]) for p in units[u])
                continue
            at = start[order[k - 1]]
            views = [_view(plan, p, s, phase) for p in units[u]]
            before.setdefault(at, []).extend(views)
            before[at].extend(gather(p, v.outputs[0]) for p, v in zip(units[u], views))
        out: list[Item] = []
        for i, item in enumerate(items):
            out.extend(before.get(i, ()))
            out.append(item)
        added.extend(x for xs in before.values() for x in xs)
        plan.tasks[(s, phase)] = out
    plan.items.extend(added)


def _view(plan: MegatronPlan, p: Value, s: int, phase: str) -> Item:
    """The view of ``p``'s part that the gather of ``p`` in task ``(s, phase)`` reads: made
    where the item stands, so the gather waits for the ops before it."""
    from ._megatron_plan import VAR, Item

    shard = plan.zero3_shard[p]
    local = plan.hplan.local
    part = local.value(shard).type
    assert isinstance(part, TensorType)
    b = FunctionBuilder("zero3_view")
    x = b.input(shard.name, part.with_device(DeviceVar(VAR)))
    name = f"{p.name}_part_{phase}"
    op = b.add_op("Reshape", [x], {"shape": part.shape}, names=[name])
    after = Value(name, shard.type)
    local.env[after] = local.b.input(name, part)
    return Item(-1, op, (shard,), (after,), s, phase)


__all__ = ["plan_zero3", "units_of"]
