"""The *ops* target of ``benchmarks/fuzz.py``: one-op programs of every registered op on
operands and attributes its examples never have.

Each input takes a registered op and one of its own examples (``extra["examples"]``,
the registry walk's), then changes one operand type or one attribute: a scalar where a
tensor goes, a zero-sized tensor (``(0, n)``, or ``(2**62, 0)``, which numpy cannot
hold), a tensor past the memory ``random_inputs`` allows, another dtype (int64, bool,
float16), another device, a tuple whose parts share a device, a tuple of one part or
one part more, an axis added or removed; an attribute of 0, -1, ``2**63``, ``10**30``,
1.5, ``None``, ``True``, text, lists with repeated or negative entries. The program is
built (``FunctionBuilder``: a rule's own IndexError or KeyError is not caught there, so
it shows as an *other exception*), printed and parsed back (it must round-trip), given
random inputs (``ir.random_inputs``), executed (``ir.execute``) and simulated on a
uniform topology over its devices, each step answering with a project error or a result.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable
from typing import Any

from fuzz_transforms import WrongOutputError

import ir
from ir.registry import OpDef, TypeContext
from ir.types import DType, TensorType, TupleType, Type

ATTRIBUTE_VALUES: list[Any] = [
    0, -1, 1, 2, 3, 2**63, 10**30, -(10**30), 1.5, -0.0, None, True, "x", "", "sum",
    [], [0, 0], [-1], [0, 1], [1, 0], [70000], (0, 1, 2), {}, {0: [0]},
]  # fmt: skip
MAX_BYTES = 2**26
"""``random_inputs``' limit here: bigger inputs are refused before anything is allocated."""

OPS = [op for op in ir.all_ops() if op.name != "Pmap"]  # Pmap: the text and programs targets


def _examples(op: OpDef, scale: int) -> list[TypeContext]:
    return [
        TypeContext(e.input_types, op.complete_attributes(e.attributes), e.subfunctions)
        for e in op.extra["examples"](scale)
    ]


def _mutated_type(rng: random.Random, t: Type) -> Type:
    """``t`` changed in one way (module doc)."""
    if isinstance(t, TupleType):
        elements = list(t.elements)
        kind = rng.randrange(5)
        if kind == 0 and len(elements) > 1:  # two parts on one device
            first = elements[0]
            if isinstance(first, TensorType):
                elements[1] = elements[1].with_device(first.device)
        elif kind == 1:
            elements = elements[:1]
        elif kind == 2:
            elements.append(elements[-1])
        else:
            i = rng.randrange(len(elements))
            elements[i] = _mutated_type(rng, elements[i])
        try:
            return TupleType(tuple(elements))
        except ir.DistIRError:
            return t
    assert isinstance(t, TensorType)
    shape = list(t.shape)
    kind = rng.randrange(10)
    try:
        if kind == 0:
            return TensorType((), t.dtype, t.device)
        if kind == 1 and shape:
            shape[rng.randrange(len(shape))] = 0
            return t.with_shape(tuple(shape))
        if kind == 2:
            return TensorType((2**62, 0), t.dtype, t.device)
        if kind == 3:
            return TensorType((2**15, 2**15, 2), t.dtype, t.device)  # 8 GiB of float32
        if kind == 4:
            dtype = rng.choice([DType.int64, DType.bool, DType.float16, DType.float64])
            return TensorType(t.shape, dtype, t.device)
        if kind == 5:
            return t.with_device(rng.choice([1, 2, 7]))
        if kind == 6:
            return t.with_shape((*t.shape, 2))
        if kind == 7 and shape:
            return t.with_shape(tuple(shape[:-1]))
        if kind == 8:
            return TupleType((t, t.with_device(t.device)))
        return t.with_shape(tuple(s + 1 for s in shape))
    except ir.DistIRError:
        return t


def _mutated(rng: random.Random, op: OpDef, example: TypeContext) -> tuple[list, dict, str]:
    """(operand types, attributes, what changed)."""
    types, attrs = list(example.input_types), dict(example.attributes)
    if attrs and rng.random() < 0.4:
        name = rng.choice(sorted(attrs))
        attrs[name] = rng.choice(ATTRIBUTE_VALUES)
        return types, attrs, f"{name}={attrs[name]!r}"
    if types:
        i = rng.randrange(len(types))
        types[i] = _mutated_type(rng, types[i])
        return types, attrs, f"operand {i}: {types[i]}"
    return types, attrs, "as in its example"


def op_case(rng: random.Random) -> tuple[str, Callable[[], Any]]:
    """A drawn op on changed operands or attributes: (what it is, the call)."""
    op = rng.choice(OPS)
    examples = _examples(op, rng.choice([1, 2, 3]))
    example = rng.choice(examples)
    types, attrs, what = _mutated(rng, op, example)

    def run() -> None:
        b = ir.FunctionBuilder(f"fuzz_{op.name.lower()}")
        inputs = [b.input(f"x{i}", t) for i, t in enumerate(types)]
        node = b.add_op(op.name, inputs, attrs, subfunctions=example.subfunctions)
        f = b.finish(list(node.outputs))
        text = ir.format(f)
        try:
            again = ir.parse(text)
        except ir.DistIRError as e:
            raise WrongOutputError(f"{op.name}: its printed program does not parse: {e}") from e
        if ir.format(again) != text:
            raise WrongOutputError(f"{op.name}: print -> parse -> print changes the text")
        xs = ir.random_inputs(f, max_bytes=MAX_BYTES)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # overflow in Pow or Exp of random numbers
            ir.execute(f, xs)
        ids = [d for d in f.devices if isinstance(d, int)]
        if ids and max(ids) < 64:
            ir.simulate(f, ir.Topology.uniform(max(ids) + 1))

    return f"{op.name} with {what[:120]}", run


__all__ = ["ATTRIBUTE_VALUES", "OPS", "op_case"]
