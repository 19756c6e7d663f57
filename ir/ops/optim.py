"""Optimizers: SGD and Adam, and their mixed-precision forms on float32 master weights.

Every optimizer record carries ``extra["optimizer"] = True``; the transforms
read its operands as: operand 0 the parameter, operand 1 its gradient, the rest
optimizer state (``extra["state"]`` names them), and result 0 the new parameter
followed by the new state in the same order.

Mixed precision (Micikevicius et al. 2018, as Megatron-LM trains): the weights and
their gradients are float16 or bfloat16, and ``MasterSGD`` / ``MasterAdam`` keep a
float32 *master* copy of each weight (and Adam's moments in float32) as optimizer
state: they update the master in float32 and write the half-precision weight from it.
Per parameter that is 2 + 2 bytes (weight, gradient) and 4 + 4 + 4 (master, m, v):
the 16 bytes of the ZeRO paper's count, of which ZeRO-1 splits the 12 over replicas.
"""

from __future__ import annotations

import numpy as np

from .. import attr_kinds as kinds
from ..errors import ExecutionError, TypeRuleError
from ..registry import Attr, Cost, CostContext, OpDef, TypeContext, register_op
from ..types import DType
from . import _factors as fx
from ._common import per_output_element, same_dtype, tensor, with_kernel
from ._examples import ctx, t


def _same_as_parameter(c: TypeContext, names: tuple[str, ...]):
    w = tensor(c, 0, names[0])
    if not w.dtype.is_float:
        raise TypeRuleError(f"parameter {names[0]} must be floating-point, got {w.dtype.value}")
    for i, name in enumerate(names[1:], start=1):
        x = tensor(c, i, name)
        if x.shape != w.shape:
            raise TypeRuleError(f"{name} has shape {x.shape}, the parameter has {w.shape}")
        same_dtype(w, x)
    for key in ("lr", "beta1", "beta2", "epsilon"):
        if key in c.attributes and not c.attributes[key] >= 0:
            raise TypeRuleError(f"{key} must be >= 0, got {c.attributes[key]!r}")
    return w


register_op(
    OpDef(
        name="SGDOptimizer",
        operands=("w", "dw"),
        results=("w1",),
        type_rule=lambda c: [_same_as_parameter(c, ("w", "dw"))],
        kernel=lambda xs, a: [(xs[0] - a["lr"] * xs[1]).astype(xs[0].dtype)],
        cost_rule=with_kernel("optimizer", per_output_element(2)),
        attributes=(Attr("lr", 0.01, "learning rate", kind=kinds.FINITE),),
        aliases=("opt", "SGD"),
        doc="Plain SGD step: w - lr * dw.",
        extra={
            "optimizer": True,
            "state": (),
            "examples": lambda s: [ctx(t(2 * s, 3), t(2 * s, 3)), ctx(t(s), t(s), lr=0.1)],
        },
    )
)


def _adam(xs, a):
    w, dw, m, v = xs
    if np.any(v < 0):  # sqrt(v) would be NaN, and so the new weights
        at = [int(i) for i in np.argwhere(np.asarray(v) < 0)[0]]
        raise ExecutionError(
            f"Adam: the second moment v must be >= 0, got {np.asarray(v)[tuple(at)]!r} at "
            f"index {at}"
        )
    b1, b2, step = a["beta1"], a["beta2"], a["step"]
    m1 = b1 * m + (1.0 - b1) * dw
    v1 = b2 * v + (1.0 - b2) * dw * dw
    m_hat = m1 / (1.0 - b1**step)
    v_hat = v1 / (1.0 - b2**step)
    w1 = w - a["lr"] * m_hat / (np.sqrt(v_hat) + a["epsilon"])
    return [x.astype(w.dtype) for x in (w1, m1, v1)]


_ADAM_ATTRIBUTES = (
    Attr("lr", 1e-3, "learning rate", kind=kinds.FINITE),
    Attr("beta1", 0.9, "decay of the first-moment estimate m", kind=kinds.PROBABILITY),
    Attr("beta2", 0.999, "decay of the second-moment estimate v", kind=kinds.PROBABILITY),
    Attr("epsilon", 1e-8, "added to sqrt(v) in the denominator", kind=kinds.NONNEG_REAL),
    Attr("step", 1, "1-based step number, for bias correction", kind=kinds.POS_INT),
)


def _adam_types(c: TypeContext):
    w = _same_as_parameter(c, ("w", "dw", "m", "v"))
    step = c.attributes["step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise TypeRuleError(f"step must be an integer >= 1 (bias correction), got {step!r}")
    return [w, w, w]


register_op(
    OpDef(
        name="Adam",
        operands=("w", "dw", "m", "v"),
        results=("w1", "m1", "v1"),
        type_rule=_adam_types,
        kernel=_adam,
        cost_rule=with_kernel("optimizer", per_output_element(4)),
        attributes=_ADAM_ATTRIBUTES,
        doc="One Adam step (Kingma & Ba 2015, with bias correction): returns (w1, m1, v1).",
        extra={
            "optimizer": True,
            "state": ("m", "v"),
            "value_ranges": lambda op: {3: (0, None)},  # v >= 0 (random_inputs reads this)
            "examples": lambda s: [
                ctx(t(2 * s, 3), t(2 * s, 3), t(2 * s, 3), t(2 * s, 3)),
                ctx(t(s), t(s), t(s), t(s), lr=0.01, step=3),
            ],
        },
    )
)


# -- mixed precision: float32 master weights -------------------------------------------


def _master_types(c: TypeContext, state: tuple[str, ...]):
    """``w``, ``dw`` of one dtype; the master and state of one wider float dtype."""
    w = tensor(c, 0, "w")
    dw = tensor(c, 1, "dw")
    if not w.dtype.is_float:
        raise TypeRuleError(f"parameter w must be floating-point, got {w.dtype.value}")
    if dw.shape != w.shape:
        raise TypeRuleError(f"dw has shape {dw.shape}, the parameter has {w.shape}")
    same_dtype(w, dw)
    xs = [tensor(c, 2 + i, name) for i, name in enumerate(state)]
    for name, x in zip(state, xs):
        if x.shape != w.shape:
            raise TypeRuleError(f"{name} has shape {x.shape}, the parameter has {w.shape}")
    same_dtype(*xs)
    if not xs[0].dtype.is_float or xs[0].dtype.itemsize_bytes < w.dtype.itemsize_bytes:
        raise TypeRuleError(
            f"the master weights are {xs[0].dtype.value}, narrower than (or not a float like) "
            f"the {w.dtype.value} weights; keep them in float32"
        )
    for key in ("lr", "beta1", "beta2", "epsilon"):
        if key in c.attributes and not c.attributes[key] >= 0:
            raise TypeRuleError(f"{key} must be >= 0, got {c.attributes[key]!r}")
    return w, xs[0]


def _master_sgd(xs, a):
    w, dw, master = xs
    master1 = master - a["lr"] * dw.astype(master.dtype)
    return [master1.astype(w.dtype), master1.astype(master.dtype)]


def _master_adam(xs, a):
    w, dw, master, m, v = xs
    w1, m1, v1 = _adam([master, dw.astype(master.dtype), m, v], a)
    return [w1.astype(w.dtype), w1, m1, v1]


def _master_adam_types(c: TypeContext):
    w, master = _master_types(c, ("master", "m", "v"))
    return [w, master, master, master]


def _master_cost(flops_per_element: float):
    """The fused update reads the gradient and the state, writes the weight and the state;
    it never reads the half-precision weight it overwrites."""

    def rule(c: CostContext) -> Cost:
        n = c.input_types[0].num_elements
        read = sum(x.size_bytes for x in c.input_types[1:])
        return Cost(flops_per_element * n, read, sum(x.size_bytes for x in c.output_types))

    return rule


def _master_examples(state: int):
    half, f32 = DType.float16, DType.float32  # (bfloat16 alike; float64 masters too)

    def examples(s: int):
        return [
            ctx(t(2 * s, 3, dtype=half), t(2 * s, 3, dtype=half), *[t(2 * s, 3)] * state),
            ctx(t(s, dtype=f32), t(s, dtype=f32), *[t(s, dtype=DType.float64)] * state),
        ]

    return examples


register_op(
    OpDef(
        name="MasterSGD",
        operands=("w", "dw", "master"),
        results=("w1", "master1"),
        type_rule=lambda c: list(_master_types(c, ("master",))),
        kernel=_master_sgd,
        cost_rule=with_kernel("optimizer", _master_cost(3)),
        attributes=(Attr("lr", 0.01, "learning rate", kind=kinds.FINITE),),
        doc="SGD on float32 master weights: master1 = master - lr * dw; w1 = master1 in w's "
        "(half) precision.",
        extra={"optimizer": True, "state": ("master",), "examples": _master_examples(1)},
    )
)

register_op(
    OpDef(
        name="MasterAdam",
        operands=("w", "dw", "master", "m", "v"),
        results=("w1", "master1", "m1", "v1"),
        type_rule=_master_adam_types,
        kernel=_master_adam,
        cost_rule=with_kernel("optimizer", _master_cost(12)),
        attributes=_ADAM_ATTRIBUTES,
        doc="Adam on float32 master weights and moments (mixed precision): the master is "
        "updated as Adam updates w, then written to w1 in w's (half) precision.",
        extra={
            "optimizer": True,
            "state": ("master", "m", "v"),
            "value_ranges": lambda op: {4: (0, None)},  # v >= 0
            "examples": _master_examples(3),
        },
    )
)


# -- sharding rules ------------------------------------------------------------------
# Optimizers update elementwise: parameters, gradients and state share every axis.

fx.attach("SGDOptimizer", lambda c: fx.same_axes(c, linear=()))


def _adam_sharding(c: TypeContext) -> dict:
    r = fx.same_axes(c, linear=())
    r["results"] = [r["operands"][0]] * 3
    return r


fx.attach("Adam", _adam_sharding)


def _master_sharding(c: TypeContext) -> dict:
    r = fx.same_axes(c, linear=())
    r["results"] = [r["operands"][0]] * (len(c.input_types) - 1)
    return r


fx.attach("MasterSGD", _master_sharding)
fx.attach("MasterAdam", _master_sharding)
