"""Small building blocks that op families share: operand checks and cost shapes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ..errors import ExecutionError, TypeRuleError
from ..registry import Cost, CostContext, TypeContext
from ..types import TensorType, TupleType, Type


def tensor(ctx: TypeContext, i: int, what: str = "") -> TensorType:
    """Operand ``i`` as a TensorType, or a TypeRuleError saying it is not one."""
    t = ctx.input_types[i]
    if not isinstance(t, TensorType):
        label = what or f"operand {i}"
        raise TypeRuleError(f"{label} must be a tensor, got {t}")
    return t


def tuple_operand(ctx: TypeContext, i: int, what: str = "") -> TupleType:
    t = ctx.input_types[i]
    if not isinstance(t, TupleType) or not t.elements:
        label = what or f"operand {i}"
        raise TypeRuleError(f"{label} must be a non-empty per-device tuple, got {t}")
    return t


def same_dtype(*types: TensorType) -> None:
    dtypes = {t.dtype for t in types}
    if len(dtypes) > 1:
        shown = ", ".join(sorted(d.value for d in dtypes))
        raise TypeRuleError(f"operands have different dtypes ({shown}); cast them first")


def broadcast_shapes(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """numpy broadcasting of two shapes, or a TypeRuleError naming both."""
    try:
        return tuple(np.broadcast_shapes(a, b))
    except ValueError:
        raise TypeRuleError(f"shapes {a} and {b} do not broadcast") from None


def normalize_axis(axis: int, rank: int, what: str = "axis") -> int:
    """``axis`` of a rank-``rank`` tensor as 0 .. rank - 1 (negative counts from the end);
    a TypeRuleError when there is no such axis (a scalar has none)."""
    if not -rank <= axis < rank:
        scalar = " (a scalar has no axes)" if rank == 0 else ""
        raise TypeRuleError(f"{what} {axis} is out of range for a rank-{rank} tensor{scalar}")
    return axis % rank


def element_sum(types: Sequence[Type]) -> int:
    """Total number of bytes of ``types`` (tuples count every element)."""
    return sum(t.size_bytes for t in types)


def memory_cost(ctx: CostContext, flops: float = 0.0) -> Cost:
    """Read every operand, write every result, and ``flops`` of arithmetic."""
    return Cost(flops, element_sum(ctx.input_types), element_sum(ctx.output_types))


def per_output_element(flops_per_element: float):
    """A cost rule: ``flops_per_element`` per result element, plus reading and writing."""

    def rule(ctx: CostContext) -> Cost:
        n = sum(t.num_elements for t in ctx.output_types if isinstance(t, TensorType))
        return memory_cost(ctx, flops_per_element * n)

    return rule


def with_kernel(kernel: str, rule):
    """``rule`` with its costs marked as ``kernel`` (``ir.registry.Cost.kernel``): a
    ``"view"`` launches nothing on a GPU, an ``"optimizer"`` step is one weight's share
    of a fused multi-tensor kernel."""

    def marked(ctx: CostContext) -> Cost:
        return replace(rule(ctx), kernel=kernel)

    return marked


def no_cost(ctx: CostContext) -> Cost:
    return Cost()


def as_tuple(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def checked_indices(op: str, what: str, values: np.ndarray, count: int) -> np.ndarray:
    """``values`` as int64 indices into ``count`` rows, or an ExecutionError naming ``op``,
    ``what`` and the first bad value: numpy would read -1 as the last row and 2.7 as 2."""
    values = np.asarray(values)
    if values.dtype.kind not in "iub":
        whole = np.isfinite(values) & (values == np.round(values))
        if not whole.all():
            at = tuple(int(i) for i in np.argwhere(~whole)[0])
            raise ExecutionError(
                f"{op}: {what} must be whole numbers, got {values[at].item()!r} at index {list(at)}"
            )
    bad = (values < 0) | (values >= count)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ExecutionError(
            f"{op}: {what} must be in [0, {count}), got {values[at].item()!r} at index {list(at)}"
        )
    return values.astype(np.int64, copy=False)
