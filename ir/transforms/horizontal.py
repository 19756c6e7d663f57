"""Horizontal (tensor) parallelism, Megatron style (seeds 000 and 003).

A weight read by ``MatMul(x, W1)`` with a replicated ``x`` is split by columns;
the split flows through elementwise ops (and, in attention, through the
``Reshape``/``Transpose`` to heads, the per-head matmuls and the softmax) until a
``MatMul(h, W2)`` contracts over it: ``W2`` is split by rows and the result is a
partial sum, all-reduced once. The backward pass follows the same rules
(``MatMulGrad`` of the column weight yields a partial ``dx``, summed by one
all-reduce), and the optimizer updates each shard where it lives.

Which weights to split is decided optimistically: every candidate column weight
is split, and when its split reaches an op that needs the whole value (a
``LayerNorm`` or ``Loss`` over the split axis, a program output) the weights it
came from are kept whole and the plan is made again. Everything else runs
replicated. Attention splits by heads when the local hidden size is a multiple
of the head size (the heads divide evenly). Otherwise the unfused form (``MatMul``,
``Softmax``, ...) stays replicated, while a fused ``Attention`` op (whose record gives
its ``heads_limit``) is refused with a ``TransformError`` naming the degree and heads.

The result is a steady-state step (DESIGN.md): a split weight is the tuple of
its shards (layout ``S(1)`` by columns, ``S(0)`` by rows), every other input a
per-device replica (``R``). Outputs: the updated weights and their optimizer
state come back in their inputs' layouts (the next step's inputs); replicated
outputs (``y``, the loss) are returned as per-device tuples, one copy per
device, partial sums reduced onto the output device. ``inputs="distribute"``
gives the seeds' form: whole inputs scattered and broadcast by the step, split
outputs gathered.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..function import Function
from ..registry import get_op
from ..sharding.facts import ProgramFacts
from ..types import DeviceRef
from ..value import Value
from ..verify import describe_op, verify
from ._emit import emit
from ._rewrite import TransformError, check_devices, check_spmd_options, parameter_inputs
from ._rules import MegatronRule, SequenceParallelRule
from ._spmd import Link, R
from ._spmd import Plan as _Plan
from .tensor_limits import TensorReplicationError


def horizontal_plan(
    f: Function,
    degree: int,
    var: str = "d",
    sequence: tuple[int, ...] | None = None,
    allow_replication: bool = False,
    links: Mapping[Value, Link] | None = None,
    facts: ProgramFacts | None = None,
) -> _Plan:
    """The plan of ``horizontal_parallel``; raises if no weight can be split.

    ``sequence``: with Megatron sequence parallelism, the leading shape of activations
    (see :class:`~ir.transforms._rules.SequenceParallelRule`). ``allow_replication``:
    keep a fused attention whose heads ``degree`` does not divide whole on every device
    instead of refusing it (``T.megatron(..., allow_replication=True)``). ``links``: inputs
    an outer level's conversions make (``ir.transforms._megatron_levels``), never weights.
    ``facts``: ``ProgramFacts(f)``, if made (its op signatures are read once for all the
    planning rounds).
    """
    facts = ProgramFacts.of("horizontal_plan", f, facts)
    links = links or {}
    params = [v for v in parameter_inputs(f) if v not in links]
    resident, grown = resident_state(f)
    forced: frozenset[Value] = frozenset()
    cache: dict = {}
    # Split outputs shaped like a weight (updated weights, gradients) are gathered; a split
    # activation output means the split went too far. Resident state (a KV cache) and what
    # extends it stay split.
    weight_shapes = {v.type.shape for v in params}
    # logits a vocabulary-parallel cross-entropy reads (ops with index operands, see
    # ir.transforms.vocab_parallel) stay split over the classes when returned
    indexed = {
        v for op in f.ops if get_op(op.op_type).extra.get("index_operands") for v in op.inputs
    }
    for _ in range(len(params) + 1):
        rule: Any = MegatronRule(degree, forced, cache)
        if sequence is not None:
            rule = SequenceParallelRule(rule, frozenset(params), sequence)
        plan = _Plan(f, degree, dict.fromkeys([*params, *resident]), rule, var, links, facts=facts)
        # with sequence parallelism, gathering token slices is the plan, not a failure
        tokens = rule.token_split if sequence is not None else set()
        bad = [k for k in plan.gathers if k not in tokens]
        bad += [
            plan.current[v]
            for v in f.outputs
            if plan.state[plan.current[v]].kind == "S"
            and v.type.shape not in weight_shapes
            and v not in indexed
            and v not in grown
        ]
        culprits = frozenset().union(*(plan.prov[k] for k in bad)) - forced
        if not culprits:
            break
        forced |= culprits
    if degree > 1 and not allow_replication:
        check_heads(plan, degree)
    return plan


def resident_state(f: Function) -> tuple[list[Value], set[Value]]:
    """The inputs of ``f`` that are resident state extended in place (an op record's
    ``extra["appends_to"]``: a KV cache ``CacheAppend`` reads), and the values extending
    them. Tensor parallelism lays such an input out as the op reading it needs (split by
    kv heads with the new token's keys), never whole on every device."""
    inputs = set(f.inputs)
    resident: dict[Value, None] = {}
    grown: set[Value] = set()
    for op in f.ops:
        i = get_op(op.op_type).extra.get("appends_to")
        if i is not None and op.inputs[i] in inputs:
            resident[op.inputs[i]] = None
            grown.update(op.outputs)
    return list(resident), grown


def check_heads(plan: _Plan, degree: int) -> None:
    """Refuse an op that splits by heads (its record's ``extra["heads_limit"]``: the fused
    ``Attention``) left whole, because ``degree`` does not divide its heads or because the
    plan could not split it: replicating it on every device would be a silent, slower
    program."""
    for step in plan.steps:
        if step.op is None:
            continue
        limit = get_op(step.op.op_type).extra.get("heads_limit")
        if limit is None or any(plan.state[k] not in (R, None) for k in step.keys):
            continue
        problem = limit(tuple(v.type for v in step.op.inputs), degree)
        if problem:
            raise TensorReplicationError(f"{problem}\n  in: {describe_op(step.op)}")
        raise TensorReplicationError(
            f"tensor parallelism of degree {degree} divides this attention's heads, but the "
            "tensor plan left it whole on every device (its query, key or value projection "
            "split along another axis than the heads: a single key/value head's channels); "
            "use allow_replication=True to build it replicated anyway\n  in: "
            f"{describe_op(step.op)}"
        )


def _check_split(f: Function, plan: _Plan, degree: int) -> None:
    split = [(v, s) for v, s in plan.state.items() if s is not None and s.kind == "S"]
    if not any(v in f.inputs for v, _ in split):
        raise TransformError(
            f"horizontal parallelism found no weight to split in {f.name}: it splits MatMul "
            f"pairs (MatMul(x, W1) -> elementwise ops -> MatMul(h, W2)) and attention heads"
        )
    for v, s in split:
        if v.type.shape[s.dim] < degree:
            raise TransformError(
                f"horizontal degree {degree} is larger than dim {s.dim} of {v.name!r} "
                f"(shape {v.type.shape}); use at most {v.type.shape[s.dim]}"
            )


def horizontal_plan_checked(f: Function, degree: int, var: str = "d") -> _Plan:
    """``horizontal_plan`` that raises unless some weight splits ``degree`` ways."""
    if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
        raise TransformError(f"the horizontal degree must be a positive integer, got {degree!r}")
    plan = horizontal_plan(f, degree, var)
    _check_split(f, plan, degree)
    return plan


def horizontal_parallel(
    f: Function,
    degree: int,
    devices: Sequence[DeviceRef] | None = None,
    *,
    topology: Any = None,
    inputs: str = "resident",
    replicated: str = "tuple",
    output_device: DeviceRef | str = "same",
    var: str = "d",
    device_map: dict | None = None,
    inner: Callable[[Function, list], Function] | None = None,
) -> Function:
    """``f`` with its MatMul pairs and attention heads split over ``degree`` devices.

    The keyword options are those of :func:`ir.transforms.data_parallel`.

    >>> import ir
    >>> from ir.transforms import horizontal_parallel
    >>> b = ir.FunctionBuilder("mlp")
    >>> w1 = b.input("w1", ir.TensorType((4, 8), ir.DType.float64, 0))
    >>> w2 = b.input("w2", ir.TensorType((8, 3), ir.DType.float64, 0))
    >>> x = b.input("x", ir.TensorType((6, 4), ir.DType.float64, 0))
    >>> h = b.call("Relu", b.call("MatMul", x, w1, name="a"), name="h")
    >>> g = horizontal_parallel(b.finish(b.call("MatMul", h, w2, name="y")), 2)
    >>> [op.op_type for op in g.ops], g.input_layouts
    (['Pmap', 'Reduce'], (('S(1)',), ('S(0)',), ('R',)))
    """
    check_spmd_options(
        "horizontal_parallel",
        f,
        topology,
        inputs=inputs,
        replicated=replicated,
        output_device=output_device,
        var=var,
        device_map=device_map,
        inner=inner,
    )
    devices = check_devices(devices, degree, topology)
    plan = horizontal_plan_checked(f, degree, var)
    out = emit(
        plan,
        devices,
        inputs=inputs,
        replicated=replicated,
        output_device=output_device,
        device_map=device_map,
        inner=inner,
    )
    return verify(out)


__all__ = ["check_heads", "horizontal_parallel", "horizontal_plan", "horizontal_plan_checked"]
