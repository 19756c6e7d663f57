"""The ATen table's elementwise part beyond plain arithmetic: ops with a Python number
operand (``mul.Scalar``, ``eq.Scalar``: what models as they come compute position ids
and masks with), comparisons and logic, clamps and activations, tensors filled with one
value (``full_like``), logarithms, and the softmax's log.

A comparison's operands meet at torch's promoted dtype (``Lowering.promoted``), not at
its bool result. Activations without a registry op of their own are written with the
pointwise ops, so their gradients and sharding come from those ops; the ``Where`` s
that select between the pieces follow torch's gradient at the boundaries, which the
ops disagree on: ``clamp`` passes ``dy`` where ``lo <= x <= hi``, ``hardtanh`` (so
``ReLU6``) and ``hardsigmoid`` only strictly inside, ``leaky_relu`` takes the negative
slope at 0. (A ReLU6 after a fresh batch norm sees exact zeros.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..types import DType
from ._aten import Lowering, Unsupported, _axis, _binary, _shape, _unary


def _compare(kind: str):
    def lower(lw: Lowering, node):
        a, b = lw.common(*node.args[:2])
        return lw.call("Compare", a, b, node=node, kind=kind)

    return lower


def _boolean(lw: Lowering, arg):
    return lw.cast(lw.value(arg, DType.bool), DType.bool)


def _logical(kind: str):
    def lower(lw: Lowering, node):
        a, b = (_boolean(lw, x) for x in node.args[:2])
        y = lw.call("Logical", a, b, node=node, kind=kind)
        return lw.cast(y, lw.dtype_of(node))

    return lower


def _bitwise(kind: str):
    def lower(lw: Lowering, node):
        if lw.dtype_of(node) is not DType.bool:
            raise Unsupported("bitwise arithmetic on integers")
        return _logical(kind)(lw, node)

    return lower


def _not(lw: Lowering, node):
    if lw.dtype_of(node) is not DType.bool:
        raise Unsupported("bitwise arithmetic on integers")
    return lw.call("Not", _boolean(lw, node.args[0]), node=node)


def _rsub(lw: Lowering, node):
    if node.kwargs.get("alpha", node.args[2] if len(node.args) > 2 else 1) != 1:
        raise Unsupported("alpha != 1")
    x, other = lw.operands(node, node.args[:2])
    return lw.call("Sub", other, x, node=node)


def _div_mode(lw: Lowering, node):
    mode = node.kwargs.get("rounding_mode")
    a, b = lw.operands(node, node.args[:2])
    if mode is None:
        return lw.call("Div", a, b, node=node)
    if a.type.dtype.is_float:
        q = lw.b.call("Div", a, b, name=f"{node.name}_q")
        return lw.call("Floor", q, node=node) if mode == "floor" else _trunc(lw, node, q)
    if mode == "trunc":
        return lw.call("Div", a, b, node=node)  # the registry's integer Div truncates
    raise Unsupported(f"rounding_mode {mode!r} of integers")


def _trunc(lw: Lowering, node, q):
    """Rounding toward zero: floor above zero, ceil below."""
    zero = lw.constant(0.0, q.type.dtype)
    below = lw.b.call("Compare", q, zero, kind="lt", name=f"{node.name}_neg")
    return lw.call("Where", below, lw.b.call("Ceil", q), lw.b.call("Floor", q), node=node)


def _pow_scalar_base(lw: Lowering, node):
    base, x = lw.operands(node, node.args[:2])
    return lw.call("Power", base, x, node=node)


def _pow_tensors(lw: Lowering, node):
    a, b = lw.operands(node, node.args[:2])
    return lw.call("Power", a, b, node=node)


def _reciprocal(lw: Lowering, node):
    (x,) = lw.operands(node, node.args[:1])
    return lw.call("Div", lw.constant(1.0, x.type.dtype), x, node=node)


def _plus_one(op_type: str, after: bool):
    """``log1p`` (log of 1 + x) and ``expm1`` (exp of x, less 1)."""

    def lower(lw: Lowering, node):
        (x,) = lw.operands(node, node.args[:1])
        one = lw.constant(1.0, x.type.dtype)
        if after:
            return lw.call("Sub", lw.b.call(op_type, x, name=f"{node.name}_e"), one, node=node)
        return lw.call(op_type, lw.b.call("Add", x, one, name=f"{node.name}_1p"), node=node)

    return lower


def _isnan(lw: Lowering, node):
    x = lw.value(node.args[0])
    return lw.call("Compare", x, x, node=node, kind="ne")


def _clamp_between(lw: Lowering, node, low, high, strict: bool = False):
    """``x`` held within ``[low, high]`` (either may be None): ``x`` where inside (the
    gradient's way), else the bound it crossed. ``strict``: at a bound, the bound."""
    out = lw.dtype_of(node)
    x = lw.cast(lw.value(node.args[0]), out)
    if low is None and high is None:
        return lw.call("Identity", x, node=node)
    name = node.name
    bounds = {
        k: lw.cast(lw.value(v, out), out) for k, v in (("lo", low), ("hi", high)) if v is not None
    }
    tests = {"lo": "gt" if strict else "ge", "hi": "lt" if strict else "le"}
    inside = [
        lw.b.call("Compare", x, v, kind=tests[k], name=f"{name}_{k}") for k, v in bounds.items()
    ]
    keep = inside[0]
    if len(inside) == 2:
        keep = lw.b.call("Logical", inside[0], inside[1], kind="and", name=f"{name}_inside")
    if len(bounds) == 1:
        (edge,) = bounds.values()
    else:
        under = lw.b.call(
            "Compare", x, bounds["lo"], kind="le" if strict else "lt", name=f"{name}_under"
        )
        edge = lw.b.call("Where", under, bounds["lo"], bounds["hi"], name=f"{name}_edge")
    return lw.call("Where", keep, x, edge, node=node)


def _clamp(lw: Lowering, node):
    given = [*node.args[1:3], None, None]
    low = node.kwargs.get("min", given[0])
    high = node.kwargs.get("max", given[1])
    return _clamp_between(lw, node, low, high)


def _hardtanh(lw: Lowering, node):
    low = node.args[1] if len(node.args) > 1 else node.kwargs.get("min_val", -1.0)
    high = node.args[2] if len(node.args) > 2 else node.kwargs.get("max_val", 1.0)
    return _clamp_between(lw, node, low, high, strict=True)


def _hard_sigmoid_of(lw: Lowering, x, name: str, node=None):
    """relu6(x + 3) / 6: x / 6 + 1/2 strictly between -3 and 3, else 0 or 1 (torch's
    gradient: none at the bounds); the last op ``node``'s when given."""
    dtype = x.type.dtype
    shifted = lw.b.call("Add", lw.b.call("Scale", x, factor=1.0 / 6.0), lw.constant(0.5, dtype))
    above = lw.b.call("Compare", x, lw.constant(-3.0, dtype), kind="gt", name=f"{name}_above")
    below = lw.b.call("Compare", x, lw.constant(3.0, dtype), kind="lt", name=f"{name}_below")
    inside = lw.b.call("Logical", above, below, kind="and", name=f"{name}_inside")
    edge = lw.b.call("Where", above, lw.constant(1.0, dtype), lw.constant(0.0, dtype))
    if node is not None:
        return lw.call("Where", inside, shifted, edge, node=node)
    return lw.b.call("Where", inside, shifted, edge, name=name)


def _hardsigmoid(lw: Lowering, node):
    (x,) = lw.operands(node, node.args[:1])
    return _hard_sigmoid_of(lw, x, node.name, node=node)


def _hardswish(lw: Lowering, node):
    (x,) = lw.operands(node, node.args[:1])
    return lw.call("Mul", x, _hard_sigmoid_of(lw, x, f"{node.name}_gate"), node=node)


def _leaky_relu(lw: Lowering, node):
    (x,) = lw.operands(node, node.args[:1])
    slope = node.args[1] if len(node.args) > 1 else node.kwargs.get("negative_slope", 0.01)
    zero = lw.constant(0.0, x.type.dtype)
    above = lw.b.call("Compare", x, zero, kind="gt", name=f"{node.name}_pos")
    return lw.call("Where", above, x, lw.b.call("Scale", x, factor=float(slope)), node=node)


def _elu(lw: Lowering, node):
    (x,) = lw.operands(node, node.args[:1])
    given = [*node.args[1:4], 1.0, 1.0, 1.0]
    alpha, scale, input_scale = given[0], given[1], given[2]
    inner = x if input_scale == 1 else lw.b.call("Scale", x, factor=float(input_scale))
    below = lw.b.call("Sub", lw.b.call("Exp", inner), lw.constant(1.0, x.type.dtype))
    below = lw.b.call("Scale", below, factor=float(alpha))
    negative = lw.b.call(
        "Compare", x, lw.constant(0.0, x.type.dtype), kind="le", name=f"{node.name}_neg"
    )
    if scale == 1:
        return lw.call("Where", negative, below, x, node=node)
    y = lw.b.call("Where", negative, below, x, name=f"{node.name}_elu")
    return lw.call("Scale", y, factor=float(scale), node=node)


def _softplus(lw: Lowering, node):
    (x,) = lw.operands(node, node.args[:1])
    beta = float(node.args[1]) if len(node.args) > 1 else 1.0
    threshold = float(node.args[2]) if len(node.args) > 2 else 20.0
    bx = x if beta == 1 else lw.b.call("Scale", x, factor=beta)
    soft = lw.b.call("Log", lw.b.call("Add", lw.b.call("Exp", bx), lw.constant(1.0, x.type.dtype)))
    if beta != 1:
        soft = lw.b.call("Scale", soft, factor=1.0 / beta)
    linear = lw.b.call("Compare", bx, lw.constant(threshold, x.type.dtype), kind="gt")
    return lw.call("Where", linear, x, soft, node=node)


def _mish(lw: Lowering, node):
    (x,) = lw.operands(node, node.args[:1])
    soft = lw.b.call("Log", lw.b.call("Add", lw.b.call("Exp", x), lw.constant(1.0, x.type.dtype)))
    return lw.call("Mul", x, lw.b.call("Tanh", soft), node=node)


def _filled(value):
    """A tensor of the node's shape and dtype holding ``value`` (or the node's own ``fill``
    argument): ``full_like``, ``zeros_like``, ``new_ones``."""

    def lower(lw: Lowering, node):
        fill = value
        if fill is None:
            fill = node.args[1] if len(node.args) > 1 else node.kwargs.get("fill_value")
            if fill is None and len(node.args) > 2:
                fill = node.args[2]
        if hasattr(fill, "op"):
            raise Unsupported("a fill value computed from tensors")
        return lw.constant(fill, lw.dtype_of(node), _shape(node))

    return lower


def _new_full(lw: Lowering, node):
    return _filled(node.args[2] if len(node.args) > 2 else node.kwargs["fill_value"])(lw, node)


def _log_softmax(lw: Lowering, node):
    x, dim = lw.value(node.args[0]), node.args[1]
    axis = _axis(dim, x.type.rank)
    top = lw.b.call("ReduceMax", x, axes=(axis,), keepdims=True, name=f"{node.name}_top")
    shifted = lw.b.call("Sub", x, top, name=f"{node.name}_shifted")
    total = lw.b.call("ReduceSum", lw.b.call("Exp", shifted), axes=(axis,), keepdims=True)
    return lw.call("Sub", shifted, lw.b.call("Log", total), node=node)


def _extreme(op_type: str):
    def lower(lw: Lowering, node):
        x = lw.value(node.args[0])
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", [])
        dims = [dims] if isinstance(dims, int) else list(dims or [])
        keep = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        axes = tuple(_axis(d, x.type.rank) for d in dims) or None
        return lw.call(op_type, x, node=node, axes=axes, keepdims=bool(keep))

    return lower


def _extreme_with_index(op_type: str):
    def lower(lw: Lowering, node):
        values = _extreme(op_type)(lw, node)
        return (values, None)  # the indices: what reads them is refused at the getitem

    return lower


def _var(lw: Lowering, node):
    x = lw.value(node.args[0])
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    correction = node.kwargs.get("correction", 1)
    keep = node.kwargs.get("keepdim", False)
    axes = tuple(range(x.type.rank)) if not dims else tuple(_axis(d, x.type.rank) for d in dims)
    n = 1
    for a in axes:
        n *= x.type.shape[a]
    mean = lw.b.call("ReduceMean", x, axes=axes, keepdims=True, name=f"{node.name}_mean")
    centred = lw.b.call("Sub", x, mean, name=f"{node.name}_centred")
    square = lw.b.call(
        "ReduceSum", lw.b.call("Mul", centred, centred), axes=axes, keepdims=bool(keep)
    )
    return lw.call("Scale", square, factor=1.0 / max(n - float(correction or 0), 1e-300), node=node)


TABLE: dict[str, Callable[[Lowering, Any], Any]] = {
    # a Python number as an operand
    "aten.add.Scalar": _binary("Add"),
    "aten.sub.Scalar": _binary("Sub"),
    "aten.mul.Scalar": _binary("Mul"),
    "aten.div.Scalar": _binary("Div"),
    "aten.div.Tensor_mode": _div_mode,
    "aten.rsub.Scalar": _rsub,
    "aten.rsub.Tensor": _rsub,
    "aten.pow.Scalar": _pow_scalar_base,
    "aten.pow.Tensor_Tensor": _pow_tensors,
    "aten.reciprocal.default": _reciprocal,
    "aten.maximum.default": _binary("Maximum"),
    "aten.minimum.default": _binary("Minimum"),
    # comparisons and logic
    **{
        f"aten.{k}.{v}": _compare(k)
        for k in ("eq", "ne", "lt", "le", "gt", "ge")
        for v in ("Scalar", "Tensor")
    },
    "aten.logical_and.default": _logical("and"),
    "aten.logical_or.default": _logical("or"),
    "aten.logical_xor.default": _logical("xor"),
    "aten.logical_not.default": lambda lw, node: lw.call(
        "Not", _boolean(lw, node.args[0]), node=node
    ),
    "aten.bitwise_and.Tensor": _bitwise("and"),
    "aten.bitwise_or.Tensor": _bitwise("or"),
    "aten.bitwise_xor.Tensor": _bitwise("xor"),
    "aten.bitwise_not.default": _not,
    "aten.isnan.default": _isnan,
    # pointwise math
    "aten.log.default": _unary("Log"),
    "aten.log1p.default": _plus_one("Log", after=False),
    "aten.expm1.default": _plus_one("Exp", after=True),
    "aten.abs.default": _unary("Abs"),
    "aten.sign.default": _unary("Sign"),
    "aten.floor.default": _unary("Floor"),
    "aten.ceil.default": _unary("Ceil"),
    "aten.round.default": _unary("Round"),
    # clamps and activations
    "aten.clamp.default": _clamp,
    "aten.clamp.Tensor": _clamp,
    "aten.clamp_min.default": lambda lw, node: _clamp_between(lw, node, node.args[1], None),
    "aten.clamp_max.default": lambda lw, node: _clamp_between(lw, node, None, node.args[1]),
    "aten.hardtanh.default": _hardtanh,
    "aten.hardsigmoid.default": _hardsigmoid,
    "aten.hardswish.default": _hardswish,
    "aten.leaky_relu.default": _leaky_relu,
    "aten.elu.default": _elu,
    "aten.softplus.default": _softplus,
    "aten.mish.default": _mish,
    "aten._log_softmax.default": _log_softmax,
    # one value everywhere
    "aten.full_like.default": _filled(None),
    "aten.zeros_like.default": _filled(0),
    "aten.ones_like.default": _filled(1),
    "aten.empty_like.default": _filled(0),
    "aten.new_zeros.default": _filled(0),
    "aten.new_ones.default": _filled(1),
    "aten.new_empty.default": _filled(0),
    "aten.new_full.default": _new_full,
    # reductions
    "aten.amax.default": _extreme("ReduceMax"),
    "aten.amin.default": _extreme("ReduceMin"),
    "aten.max.dim": _extreme_with_index("ReduceMax"),
    "aten.min.dim": _extreme_with_index("ReduceMin"),
    "aten.var.correction": _var,
}
