"""Which part of a training step each op belongs to: its weights, the backward pass.

Pipeline stages (``stage_cut``), their annotations and the 3D step read these.
"""

from __future__ import annotations

from ..function import Function
from ..op import Op
from ..value import Value
from ._rewrite import is_optimizer, parameter_inputs, starts_backward


def weights(f: Function) -> list[Value]:
    """The weights of ``f`` (what its optimizer steps update, else its parameters) in order
    of first use."""
    optimizers = [op for op in f.ops if is_optimizer(op)]
    chosen = {op.inputs[0] for op in optimizers} if optimizers else set(parameter_inputs(f))
    return list(dict.fromkeys(v for op in f.ops for v in op.inputs if v in chosen))


def gradient_ops(f: Function) -> set[Op]:
    """The ops that depend on a ``LossGrad`` result (the backward pass without replays)."""
    tainted: set[Value] = set()
    found: set[Op] = set()
    for op in f.ops:
        if starts_backward(op) or any(v in tainted for v in op.inputs):
            found.add(op)
            tainted.update(op.outputs)
    return found


def backward_ops(f: Function) -> set[Op]:
    """The backward pass: ops that depend on a ``LossGrad`` result, and ops after the first
    ``LossGrad`` that only feed the backward pass (recomputed activations)."""
    found = gradient_ops(f)
    first = next((i for i, op in enumerate(f.ops) if starts_backward(op)), len(f.ops))
    outputs = set(f.outputs)
    for op in reversed(f.ops[first:]):
        users = [u for v in op.outputs for u in f.consumers.get(v, [])]
        if users and all(u in found for u in users) and not outputs & set(op.outputs):
            found.add(op)
    return found


__all__ = ["backward_ops", "gradient_ops", "weights"]
