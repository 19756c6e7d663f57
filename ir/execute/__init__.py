"""The reference numpy executor: the oracle every transform is proven against.

Values are numpy arrays; per-device tuples are Python tuples of arrays.
Communication ops run their exact semantics from the registry's kernels; pmap
runs its body once per device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import ExecutionError
from ..function import Function
from ..registry import get_op
from ..types import TensorType, TupleType, Type
from ..value import Value
from ..verify import describe_op

__all__ = ["execute", "random_inputs"]


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
    args = _bind_inputs(function, inputs)
    return _run(function, args)


def _bind_inputs(function: Function, inputs: Sequence[Any] | Mapping[str, Any]) -> list[Any]:
    if isinstance(inputs, Mapping):
        missing = [v.name for v in function.inputs if v.name not in inputs]
        if missing:
            raise ExecutionError(f"{function.name}: no value given for input(s) {missing}")
        extra = set(inputs) - {v.name for v in function.inputs}
        if extra:
            raise ExecutionError(f"{function.name}: unknown input(s) {sorted(extra)}")
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
    arr = np.asarray(x)
    if arr.shape != t.shape:
        raise ExecutionError(f"input {name!r} has shape {arr.shape}, the function wants {t.shape}")
    return arr.astype(t.dtype.numpy, copy=False)


def _run(function: Function, args: Sequence[Any]) -> tuple[Any, ...]:
    env: dict[Value, Any] = dict(zip(function.inputs, args))
    for op in function.ops:
        operands = [env[v] for v in op.inputs]
        if op.op_type == "Pmap":
            results = _run_pmap(op, operands)
        else:
            opdef = get_op(op.op_type)
            try:
                results = opdef.kernel(operands, op.attributes)
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


def random_inputs(function: Function, seed: int = 0) -> list[Any]:
    """Random arrays that fit ``function``'s inputs (integers in [0, 4) for int dtypes)."""
    rng = np.random.default_rng(seed)

    def make(t: Type) -> Any:
        if isinstance(t, TupleType):
            return tuple(make(e) for e in t.elements)
        if t.dtype.is_float:
            return rng.standard_normal(t.shape).astype(t.dtype.numpy)
        if t.dtype.value == "bool":
            return rng.integers(0, 2, t.shape).astype(bool)
        return rng.integers(0, 4, t.shape).astype(t.dtype.numpy)

    return [make(v.type) for v in function.inputs]
