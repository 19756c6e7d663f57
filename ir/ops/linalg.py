"""Matrix multiplication and its gradient.

``MatMul(a, b)`` multiplies the last two axes: ``a`` is ``(..., M, K)`` and ``b``
is ``(K, N)`` (a weight shared by every batch entry) or ``(..., K, N)`` with the
same leading axes. ``MatMulGrad(a, b, dy)`` returns ``(db, da)`` in the seeds'
order (``(dwB, da) = MatMulGrad(a, wB, dl)``).
"""

from __future__ import annotations

import numpy as np

from ..errors import TypeRuleError
from ..registry import Cost, CostContext, OpDef, TypeContext, register_op
from . import _factors as fx
from ._common import same_dtype, tensor
from ._examples import ctx, t


def _matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    if len(a) < 2 or len(b) < 2:
        raise TypeRuleError(f"MatMul needs rank >= 2 operands, got shapes {a} and {b}")
    if a[-1] != b[-2]:
        raise TypeRuleError(f"contraction dimensions differ: {a} @ {b} ({a[-1]} != {b[-2]})")
    if len(b) == 2:
        return (*a[:-1], b[-1])
    if a[:-2] != b[:-2]:
        raise TypeRuleError(f"batch dimensions differ: {a[:-2]} and {b[:-2]}")
    return (*a[:-1], b[-1])


def _matmul_types(ctx: TypeContext):
    a, b = tensor(ctx, 0, "left operand"), tensor(ctx, 1, "right operand")
    same_dtype(a, b)
    return [a.with_shape(_matmul_shape(a.shape, b.shape))]


def _product(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def matmul_gemm(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, int, int, int]:
    """``a @ b`` as one (batched) GEMM ``(batch, m, n, k)``: a shared ``(K, N)`` operand
    folds every leading axis of ``a`` into ``m`` (one big product, as cuBLAS runs it)."""
    if len(b) == 2:
        return (1, _product(a[:-1]), b[-1], a[-1])
    return (_product(a[:-2]), a[-2], b[-1], a[-1])


def _matmul_cost(ctx: CostContext) -> Cost:
    a, b = ctx.input_types
    (c,) = ctx.output_types
    flops = 2.0 * c.num_elements * a.shape[-1]
    gemm = matmul_gemm(a.shape, b.shape)
    return Cost(flops, a.size_bytes + b.size_bytes, c.size_bytes, matrix_flops=flops, gemms=(gemm,))


register_op(
    OpDef(
        name="MatMul",
        operands=("a", "b"),
        results=("c",),
        type_rule=_matmul_types,
        kernel=lambda xs, attrs: [np.matmul(xs[0], xs[1])],
        cost_rule=_matmul_cost,
        doc="c = a @ b over the last two axes; b may be a shared (K, N) matrix.",
        extra={
            "weight_operands": (1,),  # b reads a weight in a forward program
            "examples": lambda s: [
                ctx(t(2 * s, 3 * s), t(3 * s, s)),
                ctx(t(2, s, 3), t(3, 2 * s)),
                ctx(t(2, s, 3), t(2, 3, s)),
            ],
        },
    )
)


def _matmul_grad_types(ctx: TypeContext):
    a, b, dy = (tensor(ctx, i, n) for i, n in enumerate(("a", "b", "dy")))
    same_dtype(a, b, dy)
    want = _matmul_shape(a.shape, b.shape)
    if dy.shape != want:
        raise TypeRuleError(f"dy has shape {dy.shape}, but a @ b has shape {want}")
    return [b, a]


def _matmul_grad_kernel(xs, attrs):
    a, b, dy = xs
    da = np.matmul(dy, np.swapaxes(b, -1, -2))
    if b.ndim == 2 and a.ndim > 2:
        db = np.tensordot(a, dy, axes=(list(range(a.ndim - 1)), list(range(dy.ndim - 1))))
    else:
        db = np.matmul(np.swapaxes(a, -1, -2), dy)
    return [db, da]


def _matmul_grad_cost(ctx: CostContext) -> Cost:
    a, b, dy = ctx.input_types
    flops = 2.0 * 2.0 * dy.num_elements * a.shape[-1]
    read, written = a.size_bytes + b.size_bytes + dy.size_bytes, a.size_bytes + b.size_bytes
    batch, m, n, k = matmul_gemm(a.shape, b.shape)
    # da = dy @ b^T: (m, k) from (m, n) x (n, k); db = a^T @ dy: (k, n) from (k, m) x (m, n),
    # every leading axis of a summed into the product when b is a shared matrix
    gemms = ((batch, m, k, n), (batch, k, n, m))
    return Cost(flops, read, written, matrix_flops=flops, gemms=gemms, launches=2)


register_op(
    OpDef(
        name="MatMulGrad",
        operands=("a", "b", "dy"),
        results=("db", "da"),
        type_rule=_matmul_grad_types,
        kernel=_matmul_grad_kernel,
        cost_rule=_matmul_grad_cost,
        doc="Gradients of c = a @ b given dc: returns (db, da), the seeds' order.",
        extra={
            "weight_operands": (1,),
            "examples": lambda s: [
                ctx(t(2 * s, 3 * s), t(3 * s, s), t(2 * s, s)),
                ctx(t(2, s, 3), t(3, 2 * s), t(2, s, 2 * s)),
                ctx(t(2, s, 3), t(2, 3, s), t(2, s, s)),
            ],
        },
    )
)


# -- sharding rules ------------------------------------------------------------------
# MatMul (..., M, K) @ (K, N): batch and M follow a, N follows b; sharding the
# contraction K gives a Partial sum (the RFC's I_SUM).


def _matmul_factors(a_rank: int, b_rank: int):
    batch = fx.axes(a_rank - 2, "b")
    a = (*batch, "m", "k")
    b = ("k", "n") if b_rank == 2 else (*batch, "k", "n")
    return batch, a, b


def _matmul_sharding(c: TypeContext) -> dict:
    batch, a, b = _matmul_factors(c.input_types[0].rank, c.input_types[1].rank)
    return fx.rule([a, b], [(*batch, "m", "n")], reduce={"k": "sum"}, linear=[(0,), (1,)])


def _matmul_grad_sharding(c: TypeContext) -> dict:
    a_rank, b_rank = c.input_types[0].rank, c.input_types[1].rank
    batch, a, b = _matmul_factors(a_rank, b_rank)
    reduce = {"m": "sum", "n": "sum", "k": "sum"}
    if b_rank == 2:
        reduce.update(dict.fromkeys(batch, "sum"))
    return fx.rule([a, b, (*batch, "m", "n")], [b, a], reduce=reduce, linear=[(2,)])


fx.attach("MatMul", _matmul_sharding)
fx.attach("MatMulGrad", _matmul_grad_sharding)


# -- gradient rules (autodiff) -------------------------------------------------------
# MatMulGrad returns (db, da), the seeds' order; a rule returns per operand (da, db).


def _matmul_gradient(b, op, ins, outs, dys):
    from ._grad import gname

    (dy,) = dys
    if dy is None:
        return [None, None]
    a, w = ins
    db, da = b.call("MatMulGrad", a, w, dy, name=[gname(w), gname(a)])
    return [da, db]


def _attach_gradient_rules() -> None:
    from ..registry import attach_rule

    attach_rule("MatMul", "gradient_rule", _matmul_gradient)


_attach_gradient_rules()
