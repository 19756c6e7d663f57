"""The reference numpy executor: the oracle every transform is proven against.

Values are numpy arrays; per-device tuples are Python tuples of arrays.
Communication ops run their exact semantics from the registry's kernels; pmap
runs its body once per device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import ml_dtypes
import numpy as np

from ..arguments import function_arg, int_arg, nested_shape, sequence_arg
from ..errors import ArgumentError, ExecutionError
from ..function import Function
from ..registry import OpKind, get_op
from ..types import TensorType, TupleType, Type
from ..value import Value
from ..verify import describe_op

__all__ = ["execute", "input_value_ranges", "random_inputs"]


def execute(function: Function, inputs: Sequence[Any] | Mapping[str, Any]) -> tuple[Any, ...]:
    """Run ``function`` on numpy ``inputs`` (positional, or by input name); return its outputs.

    >>> import numpy as np, ir
    >>> f = ir.parse('''
    ... def f(x: Tensor[(2, 2), 0]):
    ...     y: Tensor[(2, 2), 0] = Relu(x)
    ...     return y
    ... ''')
    >>> ir.execute(f, [np.array([[1.0, -1.0], [-2.0, 2.0]], dtype=np.float32)])[0]
    array([[1., 0.],
           [0., 2.]], dtype=float32)
    """
    function_arg("execute", "function", function)
    if not isinstance(inputs, Mapping):
        sequence_arg(
            "execute",
            "inputs",
            inputs,
            "a list of arrays (one per input) or a dict from input name to array",
        )
    args = _bind_inputs(function, inputs)
    return _run(function, args)


def execute_step(
    step: Function,
    inputs: Sequence[Any] | Mapping[str, Any],
    source: Function | None = None,
    *,
    rtol: float = 1e-9,
) -> list[Any]:
    """Run a steady-state step on the sequential program's ``inputs``; return its outputs
    as whole arrays.

    The inputs are laid out by the step's input layouts (:func:`ir.distribute`), the
    step runs, and its outputs are put back together by their layouts
    (:func:`ir.collect`, replicas checked to agree to ``rtol``): what an execution proof
    compares with ``execute(source, inputs)``. Positional ``inputs`` follow ``source``'s
    inputs (default: the step's own, which keep the sequential names and order).
    """
    from ..layout import collect, distribute

    function_arg("execute_step", "step", step)
    laid_out = distribute(step, inputs, step if source is None else source)
    return collect(step, execute(step, laid_out), rtol)


def _bind_inputs(function: Function, inputs: Sequence[Any] | Mapping[str, Any]) -> list[Any]:
    if isinstance(inputs, Mapping):
        missing = [v.name for v in function.inputs if v.name not in inputs]
        if missing:
            raise ExecutionError(f"{function.name}: inputs gives no value for {missing}")
        extra = set(inputs) - {v.name for v in function.inputs}
        if extra:
            raise ExecutionError(f"{function.name}: inputs names unknown inputs {sorted(extra)}")
        inputs = [inputs[v.name] for v in function.inputs]
    if len(inputs) != len(function.inputs):
        raise ExecutionError(
            f"{function.name} takes {len(function.inputs)} inputs "
            f"({', '.join(v.name for v in function.inputs)}), got {len(inputs)}"
        )
    return [_coerce(v.name, v.type, x) for v, x in zip(function.inputs, inputs)]


def _coerce(name: str, t: Type, x: Any) -> Any:
    if isinstance(t, TupleType):
        if not isinstance(x, (tuple, list)) or len(x) != len(t):
            raise ExecutionError(f"input {name!r} needs a tuple of {len(t)} arrays")
        return tuple(_coerce(f"{name}[{i}]", e, xi) for i, (e, xi) in enumerate(zip(t.elements, x)))
    if isinstance(x, (list, tuple)) and nested_shape(x) != t.shape:
        raise ExecutionError(
            f"input {name!r} has shape {nested_shape(x)}, the function wants {t.shape}"
        )
    try:
        arr = np.asarray(x)
    except (ValueError, TypeError) as e:  # ragged nested lists, say
        raise ExecutionError(f"input {name!r} is not an array: {e}") from None
    if arr.shape != t.shape:
        raise ExecutionError(f"input {name!r} has shape {arr.shape}, the function wants {t.shape}")
    _check_values(name, t, arr)
    return arr.astype(t.dtype.numpy, copy=False)


def _check_values(name: str, t: TensorType, arr: np.ndarray) -> None:
    """Refuse an input that converting to ``t``'s dtype would silently change: complex
    numbers (their imaginary part dropped), None or other objects (NaN), strings, and, for
    integer or bool inputs, fractions, NaN, infinities and values out of range."""
    kind = arr.dtype.kind
    if kind not in "biuf" and arr.dtype != t.dtype.numpy:  # bfloat16 is kind "V"
        what = {"c": "complex numbers", "O": "Python objects (None?)", "U": "strings"}
        raise ExecutionError(
            f"input {name!r} holds {what.get(kind, arr.dtype)}, the function wants "
            f"{t.dtype.value} (convert it yourself, deciding what to keep)"
        )
    if arr.size == 0:
        return
    if t.dtype.is_float:
        if kind in "iuf":  # a finite value beyond the type's range would become inf
            top = float(ml_dtypes.finfo(t.dtype.numpy).max)
            wide = arr.astype(np.float64)  # np.abs of int64's minimum is negative
            finite = np.abs(wide[np.isfinite(wide)])
            if finite.size and float(finite.max()) > top:
                raise ExecutionError(
                    f"input {name!r} holds {float(finite.max())!r}, beyond {t.dtype.value}'s "
                    f"largest value {top!r}: it would become inf"
                )
        return
    if kind == "f":
        whole = np.isfinite(arr) & (arr == np.round(arr))
        if not whole.all():
            at = [int(i) for i in np.argwhere(~whole)[0]]
            raise ExecutionError(
                f"input {name!r} is {t.dtype.value} but holds {arr[tuple(at)].item()!r} "
                f"at index {at}"
            )
    if t.dtype.value == "bool":
        lo, hi = 0, 1
    else:
        info = np.iinfo(t.dtype.numpy)
        lo, hi = info.min, info.max
    if kind != "b" and (arr.min() < lo or arr.max() > hi):
        raise ExecutionError(
            f"input {name!r} is {t.dtype.value} but holds values from {arr.min()!r} to "
            f"{arr.max()!r}, outside [{lo}, {hi}]"
        )


def _run(function: Function, args: Sequence[Any]) -> tuple[Any, ...]:
    env: dict[Value, Any] = dict(zip(function.inputs, args))
    for op in function.ops:
        operands = [env[v] for v in op.inputs]
        if op.op_type == "Pmap":
            results = _run_pmap(op, operands)
        elif op.op_type == "Task":  # its body, on the operands
            results = _run(op.subfunctions[0], operands)
        else:
            opdef = get_op(op.op_type)
            try:
                results = opdef.kernel(operands, op.attributes)
            except ExecutionError as e:  # a kernel refusing a value names it: add where
                raise ExecutionError(f"{e}\n  in: {describe_op(op)}") from None
            except Exception as e:  # a kernel failing is reported with the op that failed
                raise ExecutionError(
                    f"{op.op_type} failed: {type(e).__name__}: {e}\n  in: {describe_op(op)}"
                ) from e
        for v, r in zip(op.outputs, results):
            env[v] = _check_result(op, v, r)
    return tuple(env[v] for v in function.outputs)


def _run_pmap(op, operands: Sequence[tuple]) -> list[tuple]:
    (body,) = op.subfunctions
    n = len(operands[0])
    per_device = [_run(body, [t[k] for t in operands]) for k in range(n)]
    return [tuple(per_device[k][j] for k in range(n)) for j in range(len(body.outputs))]


def _check_result(op, v: Value, r: Any) -> Any:
    t = v.type
    if isinstance(t, TensorType):
        r = np.asarray(r)
        if r.shape != t.shape:
            raise ExecutionError(
                f"{op.op_type} kernel produced shape {r.shape} for {v.name!r}, its type says "
                f"{t.shape}\n  in: {describe_op(op)}"
            )
        return r.astype(t.dtype.numpy, copy=False)
    return tuple(r)


def random_inputs(function: Function, seed: int = 0, *, max_bytes: int = 2**33) -> list[Any]:
    """Random arrays that fit ``function``'s inputs and the ops that read them.

    Floats are standard normal, integers in [0, 4), except where an input reaches an
    operand whose op record declares ``extra["value_ranges"]`` through data movement
    only (communication, tuples, pmaps, views and the ops whose record says
    ``extra["keeps_values"]``: Split, Concat, Slice): class labels are drawn below the class count,
    token ids below the table's rows, Adam's second moment is non-negative.
    Inputs of more than ``max_bytes`` in all (8 GiB by default) are refused, before
    anything is allocated.
    """
    function_arg("random_inputs", "function", function)
    seed = int_arg("random_inputs", "seed", seed, lo=0)
    max_bytes = int_arg("random_inputs", "max_bytes", max_bytes, lo=0)
    total = sum(v.type.size_bytes for v in function.inputs)
    if total > max_bytes:
        raise ArgumentError(
            f"random_inputs: the inputs of {function.name!r} take {total:.3g} bytes, more than "
            f"max_bytes={max_bytes}; pass a larger max_bytes or use smaller sizes"
        )
    rng = np.random.default_rng(seed)
    ranges = input_value_ranges(function)

    def make(t: Type, lo: float | None, hi: float | None) -> Any:
        if isinstance(t, TupleType):
            return tuple(make(e, lo, hi) for e in t.elements)
        if t.dtype.is_float and hi is not None:  # float-typed class labels, say
            return rng.integers(int(lo or 0), max(int(lo or 0) + 1, int(hi)), t.shape).astype(
                t.dtype.numpy
            )
        if t.dtype.is_float:
            x = rng.standard_normal(t.shape)
            return (np.abs(x) if lo is not None and lo >= 0 else x).astype(t.dtype.numpy)
        if t.dtype.value == "bool":
            return rng.integers(0, 2, t.shape).astype(bool)
        low = 0 if lo is None else int(lo)
        high = max(low + 1, 4 if hi is None else int(hi))
        return rng.integers(low, high, t.shape).astype(t.dtype.numpy)

    out = []
    for i, v in enumerate(function.inputs):
        try:
            out.append(make(v.type, *ranges.get(i, (None, None))))
        except (ValueError, MemoryError) as e:  # numpy cannot hold it, or not here
            raise ArgumentError(
                f"random_inputs: input {v.name!r} of {function.name!r} ({v.type}) cannot be "
                f"made as numpy arrays here: {type(e).__name__}: {e}"
            ) from None
    return out


def input_value_ranges(function: Function) -> dict[int, tuple[float | None, float | None]]:
    """For each input of ``function`` (by position) that reaches an operand with a declared
    value range (``extra["value_ranges"]`` of its op), the tightest such range [lo, hi)."""
    labels: dict[Value, frozenset[int]] = {v: frozenset([i]) for i, v in enumerate(function.inputs)}
    found: dict[int, tuple[float | None, float | None]] = {}
    _propagate(function, labels, found)
    return found


def _propagate(
    function: Function,
    labels: dict[Value, frozenset[int]],
    found: dict[int, tuple[float | None, float | None]],
) -> None:
    for op in function.ops:
        opdef = get_op(op.op_type)
        declared = opdef.extra.get("value_ranges")
        if declared is not None:
            for k, (lo, hi) in declared(op).items():
                for i in labels.get(op.inputs[k], ()):
                    old_lo, old_hi = found.get(i, (None, None))
                    found[i] = (_tighter(old_lo, lo, max), _tighter(old_hi, hi, min))
        came_from = frozenset().union(*(labels.get(v, frozenset()) for v in op.inputs))
        if op.subfunctions:  # a pmap: each body input carries its operand's labels
            for body in op.subfunctions:
                inner = {p: labels.get(v, frozenset()) for p, v in zip(body.inputs, op.inputs)}
                _propagate(body, inner, found)
                came_from = frozenset().union(*(inner.get(v, frozenset()) for v in body.outputs))
        # moved, not computed: communication, tuples, and the ops whose results hold their
        # operands' elements (a view, a Split of the labels into microbatches)
        moved = opdef.kind is not OpKind.COMPUTE or opdef.extra.get("view")
        if came_from and (moved or opdef.extra.get("keeps_values")):
            for v in op.outputs:
                labels[v] = came_from


def _tighter(old: float | None, new: float | None, pick) -> float | None:
    return new if old is None else old if new is None else pick(old, new)
