"""Setup programs: the one-time distribution of a program's inputs to a step's.

A steady-state training step (``pipeline_parallel(..., resident=True)``) takes
each weight, optimizer state and batch slice on the device that uses it, where
the source program took everything on one device. :func:`setup_program` is the
program run once before the first step: it takes the source program's inputs
and returns the step's, sending each plain tensor whose device differs. Running
it, then the step, computes what the source program computes; its time is not
part of a step's.
"""

from __future__ import annotations

from ..builder import FunctionBuilder
from ..function import Function
from ..types import TensorType, format_type
from ..value import Value
from ..verify import verify
from ._rewrite import TransformError


def setup_program(source: Function, step: Function) -> Function:
    """A program from ``source``'s inputs to ``step``'s inputs (matched by name).

    An input whose type is the same in both passes through; a tensor on another
    device of the step is sent there (``Send``). Shapes and dtypes must agree, and
    tuple-typed (per-device) step inputs must equal the source's.

    >>> import ir, ir.models
    >>> from ir.transforms import pipeline_parallel, setup_program
    >>> f = ir.models.mlp(8, 4, 6, 5, layers=2, training=True)
    >>> setup = setup_program(f, pipeline_parallel(f, 2, 2))
    >>> [op.op_type for op in setup.ops], [v.type.device for v in setup.outputs]
    (['Send', 'Send'], [0, 1, 0, 1])
    """
    by_name = {v.name: v for v in source.inputs}
    b = FunctionBuilder(f"{step.name}_setup")
    given = {v: b.input(v.name, v.type) for v in source.inputs}
    outs: list[Value] = []
    for v in step.inputs:
        src = by_name.get(v.name)
        if src is None:
            raise TransformError(
                f"step input {v.name!r} has no source input of that name (source inputs: "
                f"{sorted(by_name)}); a setup program matches inputs by name"
            )
        have, want = src.type, v.type
        if have == want:
            outs.append(given[src])
        elif (
            isinstance(have, TensorType)
            and isinstance(want, TensorType)
            and have.with_device(want.device) == want
        ):
            name = f"{v.name}_at{want.device}"
            outs.append(b.call("Send", given[src], to_device=want.device, name=name))
        else:
            raise TransformError(
                f"step input {v.name!r} is {format_type(want)} but the source's is "
                f"{format_type(have)}; a setup program only moves whole tensors between "
                "devices (Send), it does not shard or replicate them"
            )
    return verify(b.finish(outs))


__all__ = ["setup_program"]
