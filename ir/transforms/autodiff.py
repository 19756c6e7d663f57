"""Reverse-mode differentiation and the optimizer step: ``gradients`` and ``training``.

``training(f)`` turns a forward program whose output ``loss`` is a scalar (or a
per-device tuple of replicas of one scalar, as horizontal parallelism returns it)
into the seed's training program (seed 000)::

    a = MatMul(x, wA); y = MatMul(a, wB); l = Loss(y, z)        # forward, as in f
    dl = LossGrad(y, z, 1)                                       # seed of the backward
    (dwB, da) = MatMulGrad(a, wB, dl); (dwA, _) = MatMulGrad(x, wA, da)
    wB1 = opt(wB, dwB); wA1 = opt(wA, dwA)                       # one optimizer op per param
    return wA1, wB1, y, l                                        # params, then f's outputs

Gradient rules (the contract every op family follows; see ``ir/ops/_grad.py``)::

    rule(b: FunctionBuilder, op: Op, inputs: list[Value], outputs: list[Value],
         output_grads: list[Value | None]) -> list[Value | None]

returns one gradient (or None) per operand, building its gradient ops
(``MatMulGrad``, ``ReluGrad``, ...) with ``b.call``. ``inputs``/``outputs`` are
the op's values in the new program, ``output_grads[i]`` the summed gradient of
result ``i`` (None when nothing flows back into it). Rules are attached next to
their ops with ``attach_rule(name, "gradient_rule", rule)``. Ops with a body
(``Pmap``) are differentiated here: the backward is a Pmap over a body that
recomputes the forward body and differentiates it (see ``_pmap_gradient``).

Which inputs are parameters (``params=None``): every floating-point input that
the loss depends on through a differentiable operand, except inputs named in
``DATA_INPUT_NAMES``. Labels are thereby excluded: an input that reaches a
``Loss`` only as its label operand ``z`` carries no gradient (nor do integer
token ids). ``params=[names]`` overrides the rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..arguments import bool_arg, function_arg, names_arg, real_arg
from ..builder import FunctionBuilder, rebuild_op
from ..errors import DistIRError
from ..function import Function
from ..op import Op
from ..ops._grad import add_grads, gname, zeros
from ..registry import get_op
from ..types import DType, TensorType, TupleType, Type
from ..value import Value
from ..verify import describe_op, verify

__all__ = ["DATA_INPUT_NAMES", "AutodiffError", "default_params", "gradients", "training"]

DATA_INPUT_NAMES = frozenset({"x", "tokens", "inputs"})


OPTIMIZERS = ("sgd", "adam")


class AutodiffError(DistIRError):
    """A program cannot be differentiated or trained as asked."""


# -- which values the loss depends on ------------------------------------------------


def _is_float(t: Type) -> bool:
    if isinstance(t, TupleType):
        return all(_is_float(e) for e in t.elements)
    return isinstance(t, TensorType) and t.dtype.is_float


def _unit_gradient(op: Op):
    """The record's rule for ``op``'s gradient when its output is differentiated with 1
    (``Loss`` starts the backward with ``LossGrad(y, z, 1)``), or None."""
    return get_op(op.op_type).extra.get("unit_gradient")


def _differentiable(op: Op, i: int) -> bool:
    # Operands the record marks (labels may be floats) never carry a gradient.
    nondiff = get_op(op.op_type).extra.get("nondiff_operands", ())
    return i not in nondiff and _is_float(op.inputs[i].type)


def _depends(f: Function, roots: Sequence[Value]) -> set[Value]:
    """Values that some root depends on through differentiable operands (roots included)."""
    needed = set(roots)
    for op in reversed(f.ops):
        hit = [k for k, v in enumerate(op.outputs) if v in needed]
        if not hit:
            continue
        if op.subfunctions:
            body = op.subfunctions[0]
            inner = _depends(body, [body.outputs[k] for k in hit])
            needed.update(v for v, p in zip(op.inputs, body.inputs) if p in inner)
        else:
            needed.update(v for i, v in enumerate(op.inputs) if _differentiable(op, i))
    return needed


def _reaches(f: Function, sources: set[Value]) -> set[Value]:
    """Values computed (through differentiable operands) from some source."""
    reached = set(sources)
    for op in f.ops:
        if any(v in reached and _differentiable(op, i) for i, v in enumerate(op.inputs)):
            reached.update(op.outputs)
    return reached


def _loss_value(f: Function, loss: int) -> Value:
    if isinstance(loss, bool) or not isinstance(loss, int):
        raise AutodiffError(f"loss must be an output index (an integer), got {loss!r}")
    if not -len(f.outputs) <= loss < len(f.outputs):
        raise AutodiffError(
            f"loss={loss!r} is not an output index of {f.name} ({len(f.outputs)} outputs)"
        )
    v = f.outputs[loss]
    if not _is_scalar_loss(v.type):
        raise AutodiffError(
            f"{f.name}: output {loss} ({v.name!r}: {v.type}) is not a floating-point scalar "
            "loss; pass loss=<index of the scalar loss output>"
        )
    return v


def _is_scalar(t: Type) -> bool:
    return isinstance(t, TensorType) and t.rank == 0 and t.dtype.is_float


def _is_scalar_loss(t: Type) -> bool:
    """A float scalar, or a per-device tuple of replicas of one (horizontal parallelism)."""
    if isinstance(t, TupleType):
        return bool(t.elements) and all(_is_scalar(e) for e in t.elements)
    return _is_scalar(t)


def default_params(f: Function, loss: int = -1) -> list[Value]:
    """The inputs ``training`` updates by default (see the module docstring for the rule)."""
    function_arg("default_params", "f", f)
    needed = _depends(f, [_loss_value(f, loss)])
    return [
        v for v in f.inputs if v in needed and _is_float(v.type) and v.name not in DATA_INPUT_NAMES
    ]


def _resolve_params(f: Function, params: Sequence[str | Value] | None, loss: int) -> list[Value]:
    if params is None:
        found = default_params(f, loss)
        if not found:
            raise AutodiffError(f"{f.name}: the loss depends on no floating-point input")
        return found
    by_name = {v.name: v for v in f.inputs}
    chosen: list[Value] = []
    for p in params:
        v = by_name.get(p) if isinstance(p, str) else (p if p in f.inputs else None)
        if v is None:
            shown = p if isinstance(p, str) else getattr(p, "name", p)
            raise AutodiffError(
                f"param {shown!r} is not an input of {f.name} (inputs: {list(by_name)})"
            )
        if not _is_float(v.type):
            raise AutodiffError(f"param {v.name!r} has type {v.type}, not floating-point")
        chosen.append(v)
    return [v for v in f.inputs if v in chosen]


# -- the backward pass -----------------------------------------------------------------


class _Grads:
    """Gradient contributions per value of the original program, summed on first read.

    Gradients that ``TupleGet`` sends into one slot of a tuple are kept per slot and
    assembled into one ``MakeTuple`` (zeros in the slots nothing reached) when the
    tuple's gradient is read, so N reads of an N-tuple cost N ops, not N * N.
    """

    def __init__(self, b: FunctionBuilder) -> None:
        self.b = b
        self.parts: dict[Value, list[Value]] = {}
        self.slots: dict[Value, dict[int, list[Value]]] = {}
        self.items: dict[Value, list[Value]] = {}  # tuples built here -> their elements

    def add(self, v: Value, g: Value) -> None:
        self.parts.setdefault(v, []).append(g)

    def add_slot(self, v: Value, index: int, g: Value) -> None:
        self.slots.setdefault(v, {}).setdefault(index, []).append(g)

    def _sum(self, parts: list[Value], name: str) -> Value:
        total = parts[0]
        for k, g in enumerate(parts[1:]):
            total = add_grads(self.b, total, g, name if k == len(parts) - 2 else f"{name}_{k}")
        return total

    def get(self, v: Value) -> Value | None:
        slots = self.slots.pop(v, None)
        if slots:
            assert isinstance(v.type, TupleType)
            items = [
                self._sum(slots[k], f"{gname(v)}_{k}")
                if k in slots
                else zeros(self.b, e, f"{gname(v)}_{k}")
                for k, e in enumerate(v.type.elements)
            ]
            built = self.b.call("MakeTuple", *items, name=gname(v))
            self.items[built] = items
            self.parts.setdefault(v, []).append(built)
        parts = self.parts.get(v)
        if not parts:
            return None
        total = self._sum(parts, gname(v))
        self.parts[v] = [total]
        return total

    def elements(self, g: Value) -> list[Value] | None:
        """The elements of a tuple gradient built here, without TupleGet ops."""
        return self.items.get(g)


def backward(
    b: FunctionBuilder,
    f: Function,
    env: dict[Value, Value],
    roots: Sequence[tuple[Value, Value | None]],
    wrt: Sequence[Value],
) -> dict[Value, Value | None]:
    """Add the backward pass of ``f`` to ``b``; return the gradient of each ``wrt`` value.

    ``env`` maps ``f``'s values to their copies in ``b`` (the forward already
    replayed). ``roots`` pairs each output to differentiate with its upstream
    gradient in ``b``; None means "a scalar loss, gradient 1": a root made by
    ``Loss`` then starts the backward with ``LossGrad(y, z, 1)`` as the seed does.
    """
    active = _depends(f, [r for r, _ in roots]) & _reaches(f, set(wrt))
    grads = _Grads(b)
    unit_losses: set[Value] = set()
    for root, g in roots:
        if g is not None:
            grads.add(root, g)
        elif root in f.producers and _unit_gradient(f.producers[root]) is not None:
            unit_losses.add(root)
        else:
            grads.add(root, _unit_seed(b, env[root].type, gname(root)))
    for op in reversed(f.ops):
        wanted = [i for i, v in enumerate(op.inputs) if v in active and _differentiable(op, i)]
        if not wanted:
            continue
        ins = [env[v] for v in op.inputs]
        outs = [env[v] for v in op.outputs]
        if op.outputs[0] in unit_losses:
            results: list[Value | None] = _unit_gradient(op)(b, op, ins)
        elif op.op_type == "TupleGet":
            g = grads.get(op.outputs[0])
            if g is not None:
                grads.add_slot(op.inputs[0], op.attributes["index"] % len(ins[0].type), g)
            continue
        else:
            out_grads = [grads.get(v) for v in op.outputs]
            if all(g is None for g in out_grads):
                continue
            known = grads.elements(out_grads[0]) if op.op_type == "MakeTuple" else None
            results = _apply_rule(b, op, ins, outs, out_grads) if known is None else known
        for i in wanted:
            g = results[i]
            if g is None:
                continue
            if g.type != ins[i].type:
                raise AutodiffError(
                    f"the gradient rule of {op.op_type} gave operand {i} a gradient of type "
                    f"{g.type}, but the operand is {ins[i].type}\n  in: {describe_op(op)}"
                )
            grads.add(op.inputs[i], g)
    return {v: grads.get(v) for v in wrt}


def _unit_seed(b: FunctionBuilder, t: Type, name: str) -> Value:
    """Gradient 1 for a scalar loss; for a tuple of replicated losses, 1 on the first copy."""
    if isinstance(t, TupleType):
        items = [
            _unit_seed(b, e, f"{name}_{k}") if k == 0 else zeros(b, e, f"{name}_{k}")
            for k, e in enumerate(t.elements)
        ]
        return b.call("MakeTuple", *items, name=name)
    assert isinstance(t, TensorType)
    return b.call("Constant", value=1.0, shape=(), dtype=t.dtype.value, device=t.device, name=name)


def _apply_rule(
    b: FunctionBuilder, op: Op, ins: list[Value], outs: list[Value], out_grads: list[Value | None]
) -> list[Value | None]:
    if op.subfunctions:
        return _pmap_gradient(b, op, ins, out_grads)
    rule = get_op(op.op_type).gradient_rule
    if rule is None:
        raise AutodiffError(
            f"{op.op_type} has no gradient rule, so the loss cannot be differentiated "
            f"through it\n  in: {describe_op(op)}"
        )
    results = list(rule(b, op, ins, outs, out_grads))
    if len(results) != len(ins):
        raise AutodiffError(
            f"the gradient rule of {op.op_type} returned {len(results)} gradients for "
            f"{len(ins)} operands"
        )
    return results


def _pmap_gradient(
    b: FunctionBuilder, op: Op, ins: list[Value], out_grads: list[Value | None]
) -> list[Value | None]:
    """Backward of a Pmap: a Pmap whose body recomputes the forward body and differentiates it."""
    body = op.subfunctions[0]
    var = op.attributes["device_var"]
    flowing = [k for k, g in enumerate(out_grads) if g is not None]
    wrt = [p for i, p in enumerate(body.inputs) if _is_float(p.type)]
    bb = FunctionBuilder(f"{body.name}_grad")
    env = {p: bb.input(p.name, p.type) for p in body.inputs}
    seeds = [
        (body.outputs[k], bb.input(gname(body.outputs[k]), body.outputs[k].type)) for k in flowing
    ]
    for inner in body.ops:
        outs = rebuild_op(bb, inner, [env[v] for v in inner.inputs])
        env.update(zip(inner.outputs, outs))
    found = backward(bb, body, env, seeds, wrt)
    returned = [p for p in wrt if found[p] is not None]
    if not returned:
        return [None] * len(ins)
    grad_body = bb.finish([found[p] for p in returned])
    results = b.call(
        "Pmap",
        *ins,
        *[out_grads[k] for k in flowing],
        device_var=var,
        device_map=op.attributes["device_map"],
        subfunctions=[grad_body],
        name=[gname(p) for p in returned],
    )
    results = results if isinstance(results, tuple) else (results,)
    by_param = dict(zip(returned, results))
    return [by_param.get(p) for p in body.inputs]


def _master_dtype(params: list[Value], dtype: DType | str) -> DType:
    """The master weights' dtype, wider than every parameter's (mixed precision keeps
    float32 copies of float16 or bfloat16 weights)."""
    try:
        wide = dtype if isinstance(dtype, DType) else DType(dtype)
    except ValueError:
        raise AutodiffError(f"master_dtype must be a float dtype name, got {dtype!r}") from None
    narrow = [p.name for p in params if p.type.dtype.itemsize_bytes >= wide.itemsize_bytes]
    if not wide.is_float or narrow:
        raise AutodiffError(
            f"master_weights keeps {wide.value} master copies of narrower weights; "
            f"{narrow or 'the master dtype'} {'are' if narrow else 'is'} not narrower than "
            f"{wide.value}: build the model in bfloat16 or float16 (e.g. "
            "ir.models.gpt(..., dtype='bfloat16')), or pass a wider master_dtype"
        )
    return wide


# -- public entry points ----------------------------------------------------------------


def _replay(f: Function, name: str) -> tuple[FunctionBuilder, dict[Value, Value]]:
    b = FunctionBuilder(name)
    env = {v: b.input(v.name, v.type) for v in f.inputs}
    for op in f.ops:
        outs = rebuild_op(b, op, [env[v] for v in op.inputs])
        env.update(zip(op.outputs, outs))
    return b, env


def _param_grads(
    f: Function, b: FunctionBuilder, env: dict[Value, Value], params: list[Value], loss: int
) -> list[Value]:
    loss_value = _loss_value(f, loss)
    found = backward(b, f, env, [(loss_value, None)], params)
    missing = [p.name for p in params if found[p] is None]
    if missing:
        raise AutodiffError(f"{f.name}: the loss {loss_value.name!r} does not depend on {missing}")
    return [found[p] for p in params]


def gradients(f: Function, params: Sequence[str | Value] | None = None, loss: int = -1) -> Function:
    """``f`` followed by its backward pass; returns ``f``'s outputs, then d loss / d param.

    >>> import ir
    >>> g = ir.transforms.gradients(ir.models.mlp(4, 3, 5, 2))
    >>> [v.name for v in g.outputs]
    ['y', 'l', 'dwA', 'dwB']
    """
    function_arg("gradients", "f", f)
    params = names_arg("gradients", "params", params, "input names")
    chosen = _resolve_params(f, params, loss)
    b, env = _replay(f, f"{f.name}_grad")
    grads = _param_grads(f, b, env, chosen, loss)
    return verify(b.finish([*(env[v] for v in f.outputs), *grads]))


def training(
    f: Function,
    optimizer: str = "sgd",
    lr: float | None = None,
    params: Sequence[str | Value] | None = None,
    loss: int = -1,
    *,
    return_gradients: bool = False,
    master_weights: bool = False,
    master_dtype: DType | str = DType.float32,
    recompute: str | None = None,
    recompute_layers: int | None = None,
    **optimizer_attrs: Any,
) -> Function:
    """The training step of forward program ``f``: forward, backward, one optimizer op per param.

    Returns the updated params (in input order), then for Adam the updated
    state (``m_<w>1, v_<w>1`` per param), then ``f``'s outputs, then (with
    ``return_gradients``) the gradients. Adam adds the inputs ``m_<w>, v_<w>``
    per param after ``f``'s inputs. ``optimizer_attrs`` go to the optimizer op
    (``beta1``, ``step``, ...). ``master_weights=True`` (mixed precision, as Megatron-LM
    trains float16/bfloat16 models): the optimizer keeps a ``master_dtype`` (float32)
    master copy of each weight, input ``master_<w>`` before the Adam state, updates it and
    writes the half-precision weight (``MasterSGD``, ``MasterAdam``, whose moments are in
    ``master_dtype`` too); the outputs' state is ``master_<w>1`` (then ``m_<w>1,
    v_<w>1``) per param. ``recompute="selective"`` or ``"full"`` (with
    ``recompute_layers=k``: the first ``k`` layers) replays activations in the backward
    as Megatron-LM does (``ir.transforms.recompute``; per pipeline stage:
    ``megatron(..., recompute=, recompute_layers=)``).

    >>> import ir
    >>> t = ir.transforms.training(ir.models.mlp(4, 3, 5, 2, activation=None))
    >>> [v.name for v in t.outputs]
    ['wA1', 'wB1', 'y', 'l']
    """
    function_arg("training", "f", f)
    if not isinstance(optimizer, str) or optimizer not in OPTIMIZERS:
        raise AutodiffError(f"unknown optimizer {optimizer!r}; use one of {list(OPTIMIZERS)}")
    if lr is not None:
        lr = real_arg("training", "lr", lr, positive=True)
    params = names_arg("training", "params", params, "input names")
    return_gradients = bool_arg("training", "return_gradients", return_gradients)
    master_weights = bool_arg("training", "master_weights", master_weights)
    chosen = _resolve_params(f, params, loss)
    _loss_value(f, loss)
    wide = _master_dtype(chosen, master_dtype) if master_weights else None
    b, env = _replay(f, f.name)
    names = ["m", "v"] if optimizer == "adam" else []
    if master_weights:
        names = ["master", *names]
    state: dict[Value, list[Value]] = {}
    for p in chosen:
        t = p.type if wide is None else TensorType(p.type.shape, wide, p.type.device)
        state[p] = [b.input(f"{n}_{p.name}", t) for n in names]
    grads = dict(zip(chosen, _param_grads(f, b, env, chosen, loss)))
    attrs = dict(optimizer_attrs)
    if lr is not None:
        attrs["lr"] = lr
    op_type = {"sgd": "SGDOptimizer", "adam": "Adam"}[optimizer]
    if master_weights:
        op_type = {"sgd": "MasterSGD", "adam": "MasterAdam"}[optimizer]
    updated: dict[Value, Value] = {}
    for p in reversed(chosen):  # the seed updates the last layer first
        out_names = [f"{p.name}1", *(f"{n}_{p.name}1" for n in names)]
        results = b.call(op_type, env[p], grads[p], *state[p], name=out_names, **attrs)
        results = results if isinstance(results, tuple) else (results,)
        updated[p], state[p] = results[0], list(results[1:])
    new_state = [x for p in chosen for x in state[p]]
    outputs = [*(updated[p] for p in chosen), *new_state, *(env[v] for v in f.outputs)]
    if return_gradients:
        outputs += [grads[p] for p in chosen]
    step = verify(b.finish(outputs))
    if recompute is None:
        if recompute_layers is not None:
            raise AutodiffError("recompute_layers= goes with recompute='full'")
        return step
    from .recompute import recompute as replay

    return replay(step, recompute, layers=recompute_layers)
