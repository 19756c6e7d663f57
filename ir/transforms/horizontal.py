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
of the head size (the heads divide evenly); otherwise it stays replicated.

Outputs: split weights (and their optimizer state) are gathered onto the
original output's device; replicated outputs (``y``, the loss) are returned as
per-device tuples, one copy per device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..function import Function
from ..op import Op
from ..ops.communication import split_sizes
from ..types import DeviceRef
from ..value import Value
from ..verify import verify
from ._rewrite import TransformError, check_devices, is_optimizer, parameter_inputs
from ._spmd import P, R, RuleResult, S, Shard, emit
from ._spmd import Plan as _Plan

_UNARY = {"Relu", "Gelu", "Tanh", "Neg", "Identity", "Scale", "Cast", "CausalMask", "Softmax"}
_UNARY_GRAD = {"ReluGrad", "GeluGrad", "TanhGrad", "SoftmaxGrad"}
_LINEAR = {"Neg", "Identity", "Scale", "Reshape", "Transpose", "Add", "Sub", "Sum"}
_BINARY = {"Add", "Sub", "Mul", "Div"}


_States = list[Shard | None]


def _rank(v: Value) -> int:
    return v.type.rank


def _last(v: Value) -> int:
    return v.type.rank - 1


class _Rules:
    """The horizontal rules, for ``n`` devices; ``forced`` weights stay whole."""

    def __init__(self, n: int, forced: frozenset[Value]) -> None:
        self.n, self.forced = n, forced

    def __call__(self, op: Op, st: list[Shard | None]) -> RuleResult | None:
        t = op.op_type
        if all(s == P for s in st) and t in _LINEAR:
            return RuleResult([P] * len(op.outputs))
        if is_optimizer(op):
            target = st[0] or R
            decide = {i: target for i, s in enumerate(st) if s is None}
            convert = {i: target for i, s in enumerate(st) if s is not None and s != target}
            return RuleResult([target] * len(op.outputs), decide, convert)
        handler = getattr(self, f"_{t}", None)
        if handler is not None:
            return handler(op, st)
        if t in _UNARY:
            return self._unary(op, st)
        if t in _UNARY_GRAD:
            return self._unary_grad(op, st)
        if t in _BINARY:
            return self._binary(op, st)
        return None

    def _axis_ok(self, op: Op, k: int) -> bool:
        rank = _rank(op.inputs[0])
        if op.op_type in ("Softmax", "SoftmaxGrad"):
            return k != op.attributes["axis"] % rank
        if op.op_type == "CausalMask":
            return k < rank - 2
        return True

    def _unary(self, op: Op, st: _States) -> RuleResult | None:
        (x,) = st
        if x is not None and x.kind == "S" and self._axis_ok(op, x.dim):
            return RuleResult([x])
        return None

    def _unary_grad(self, op: Op, st: _States) -> RuleResult | None:
        s = st[0]
        if s == st[1] and s is not None and s.kind == "S" and self._axis_ok(op, s.dim):
            return RuleResult([s])
        return None

    def _binary(self, op: Op, st: _States) -> RuleResult | None:
        out = op.outputs[0].type
        dims = set()
        for v, s in zip(op.inputs, st):
            if s is not None and s.kind == "S":
                dims.add(s.dim + out.rank - _rank(v))
            elif s == P:
                return None
        if len(dims) != 1:
            return None
        (k,) = dims
        decide = {}
        for i, (v, s) in enumerate(zip(op.inputs, st)):
            local = k - (out.rank - _rank(v))
            has_axis = local >= 0 and v.type.shape[local] > 1
            if s is None:
                decide[i] = S(local) if has_axis else R
            elif (s == R and has_axis) or (s.kind == "S" and s.dim != local):
                return None
        return RuleResult([S(k)], decide)

    def _MatMul(self, op: Op, st: _States) -> RuleResult | None:
        a, b = st
        x, w = op.inputs
        if _rank(w) == 2:
            if b is None:
                if a == R:
                    if w in self.forced:
                        return RuleResult([R], {1: R})
                    return RuleResult([S(_last(op.outputs[0]))], {1: S(1)})
                if a is not None and a.kind == "S":
                    if a.dim == _last(x):
                        return RuleResult([P], {1: S(0)})
                    return RuleResult([a], {1: R})
                return None
            if b == R and a is not None and a.kind == "S" and a.dim < _last(x):
                return RuleResult([a])
            if b == S(1) and a == R:
                return RuleResult([S(_last(op.outputs[0]))])
            if b == S(0) and a == S(_last(x)):
                return RuleResult([P])
            return None
        if a == b and a is not None and a.kind == "S" and a.dim < _rank(x) - 2:
            return RuleResult([a])
        return None

    def _MatMulGrad(self, op: Op, st: _States) -> RuleResult | None:
        a, b, dy = st
        x, w, _ = op.inputs
        if _rank(w) == 2:
            if a == R and b == S(1) and dy == S(_last(x)):
                return RuleResult([S(1), P])
            if a == S(_last(x)) and b == S(0) and dy == R:
                return RuleResult([S(0), a])
            if b == R and a == dy and a is not None and a.kind == "S" and a.dim < _last(x):
                return RuleResult([P, a])
            return None
        if a == b == dy and a is not None and a.kind == "S" and a.dim < _rank(x) - 2:
            return RuleResult([a, a])
        return None

    def _Reshape(self, op: Op, st: _States) -> RuleResult | None:
        (x,) = st
        if x is None or x.kind != "S":
            return None
        src, dst = op.inputs[0].type.shape, op.outputs[0].type.shape
        k = x.dim
        lead = 1
        for size in src[:k]:
            lead *= size
        acc = 1
        for j, size in enumerate(dst):
            if acc == lead:
                parts = split_sizes(src[k], self.n)
                inner = 1
                for s in src[k + 1 :]:
                    inner *= s
                aligned = all((p * inner) % _inner(dst, j) == 0 for p in parts)
                if aligned and size * _inner(dst, j) == src[k] * inner:
                    return RuleResult([S(j)])
                return None
            acc *= size
        return None

    def _Transpose(self, op: Op, st: _States) -> RuleResult | None:
        (x,) = st
        if x is None or x.kind != "S":
            return None
        perm = op.attributes["perm"]
        perm = tuple(reversed(range(_rank(op.inputs[0])))) if perm is None else tuple(perm)
        return RuleResult([S(perm.index(x.dim))])

    def _LayerNorm(self, op: Op, st: _States) -> RuleResult | None:
        x = st[0]
        if x is not None and x.kind == "S" and x.dim != _last(op.inputs[0]):
            return RuleResult([x], {i: R for i in (1, 2) if st[i] is None})
        return None

    def _ReduceSum(self, op: Op, st: _States) -> RuleResult | None:
        (x,) = st
        if x is None or x.kind != "S":
            return None
        rank = _rank(op.inputs[0])
        axes = op.attributes["axes"]
        axes = range(rank) if axes is None else [axes] if isinstance(axes, int) else axes
        axes = {a % rank for a in axes}
        if x.dim in axes:
            return RuleResult([P])
        if op.attributes["keepdims"]:
            return RuleResult([x])
        return RuleResult([S(x.dim - sum(a < x.dim for a in axes))])

    def _Sum(self, op: Op, st: _States) -> RuleResult | None:
        if len(set(st)) == 1 and st[0] is not None:
            return RuleResult([st[0]])
        return None


def _inner(shape: Sequence[int], j: int) -> int:
    out = 1
    for s in shape[j + 1 :]:
        out *= s
    return out


def horizontal_plan(f: Function, degree: int, var: str = "d") -> _Plan:
    """The plan of ``horizontal_parallel``; raises if no weight can be split."""
    params = parameter_inputs(f)
    forced: frozenset[Value] = frozenset()
    # Split outputs shaped like a weight (updated weights, gradients) are gathered; a split
    # activation output means the split went too far.
    weight_shapes = {v.type.shape for v in params}
    for _ in range(len(params) + 1):
        plan = _Plan(f, degree, dict.fromkeys(params), _Rules(degree, forced), var)
        bad = list(plan.gathers)
        bad += [
            plan.current[v]
            for v in f.outputs
            if plan.state[plan.current[v]].kind == "S" and v.type.shape not in weight_shapes
        ]
        culprits = frozenset().union(*(plan.prov[k] for k in bad)) - forced
        if not culprits:
            return plan
        forced |= culprits
    return plan


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
    >>> [op.op_type for op in g.ops]
    ['Scatter', 'Scatter', 'Broadcast', 'Pmap', 'Reduce']
    """
    devices = check_devices(devices, degree, topology)
    plan = horizontal_plan_checked(f, degree, var)
    out = emit(
        plan,
        devices,
        replicated=replicated,
        output_device=output_device,
        device_map=device_map,
        inner=inner,
    )
    return verify(out)


__all__ = ["horizontal_parallel", "horizontal_plan", "horizontal_plan_checked"]
