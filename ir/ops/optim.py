"""Optimizers: SGD and Adam.

Every optimizer record carries ``extra["optimizer"] = True``; the transforms
read its operands as: operand 0 the parameter, operand 1 its gradient, the rest
optimizer state (``extra["state"]`` names them), and result 0 the new parameter
followed by the new state in the same order.
"""

from __future__ import annotations

import numpy as np

from .. import attr_kinds as kinds
from ..errors import ExecutionError, TypeRuleError
from ..registry import Attr, OpDef, TypeContext, register_op
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
        attributes=(
            Attr("lr", 1e-3, "learning rate", kind=kinds.FINITE),
            Attr("beta1", 0.9, "decay of the first-moment estimate m", kind=kinds.PROBABILITY),
            Attr("beta2", 0.999, "decay of the second-moment estimate v", kind=kinds.PROBABILITY),
            Attr("epsilon", 1e-8, "added to sqrt(v) in the denominator", kind=kinds.NONNEG_REAL),
            Attr("step", 1, "1-based step number, for bias correction", kind=kinds.POS_INT),
        ),
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


# -- sharding rules ------------------------------------------------------------------
# Optimizers update elementwise: parameters, gradients and state share every axis.

fx.attach("SGDOptimizer", lambda c: fx.same_axes(c, linear=()))


def _adam_sharding(c: TypeContext) -> dict:
    r = fx.same_axes(c, linear=())
    r["results"] = [r["operands"][0]] * 3
    return r


fx.attach("Adam", _adam_sharding)
