"""FunctionBuilder: the only mutable thing in the IR; ``finish()`` returns a verified Function."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from .arguments import str_arg
from .errors import UnknownOpError, VerifyError
from .function import Function
from .op import Op, freeze_attributes
from .registry import get_op
from .types import DeviceRef, TensorType, TupleType, Type
from .value import Value
from .verify import check_outputs, describe_op, infer_types


class FunctionBuilder:
    """Builds a Function op by op, inferring and checking types as it goes.

    >>> from ir import FunctionBuilder, TensorType
    >>> b = FunctionBuilder("double")
    >>> x = b.input("x", TensorType((2, 3), device=0))
    >>> y = b.call("Add", x, x, name="y")
    >>> print(b.finish([y]))
    def double(x: Tensor[(2, 3), 0]):
        y: Tensor[(2, 3), 0] = Add(x, x)
        return y
    """

    def __init__(self, name: str = "main") -> None:
        self.name = str_arg("FunctionBuilder", "name", name)
        self._inputs: list[Value] = []
        self._ops: list[Op] = []
        self._defined: set[Value] = set()
        self._finished = False
        self._indices: list[Mapping[str, Any]] = []  # TupleGet attributes by index, for unpack

    @property
    def ops(self) -> tuple[Op, ...]:
        return tuple(self._ops)

    def input(self, name: str, type: Type) -> Value:
        """Declare a function input."""
        str_arg("FunctionBuilder.input", "name", name)
        if not isinstance(type, (TensorType, TupleType)):
            raise VerifyError(f"input {name!r} needs a TensorType or TupleType, got {type!r}")
        v = Value(name, type)
        self._inputs.append(v)
        self._defined.add(v)
        return v

    def add_op(
        self,
        op_type: str,
        inputs: Sequence[Value],
        attributes: Mapping[str, Any] | None = None,
        *,
        names: Sequence[str] | None = None,
        subfunctions: Sequence[Function] = (),
        output_types: Sequence[Type] | None = None,
        op_name: str = "",
    ) -> Op:
        """Append an op; its result types come from the op's type rule.

        ``output_types``, when given (the parser passes the declared types),
        must equal what the rule infers. ``names`` are hints for the results.
        """
        self._check_open()
        try:
            opdef = get_op(op_type)
        except UnknownOpError as e:
            raise VerifyError(str(e)) from None
        self._check_operands(opdef.name, inputs)
        types, attrs = infer_types(
            opdef, [v.type for v in inputs], attributes or {}, tuple(subfunctions)
        )
        if output_types is not None:
            if len(output_types) != len(types):
                raise VerifyError(
                    f"{opdef.name} has {len(types)} result(s), {len(output_types)} declared"
                )
            for i, (declared, inferred) in enumerate(zip(output_types, types)):
                if declared != inferred:
                    raise VerifyError(
                        f"{opdef.name} result {i} is declared {declared} but the op's type "
                        f"rule gives {inferred}"
                    )
        if names is None:
            names = opdef.results  # pmap's results follow its body, so they may differ
            if len(types) != len(names):
                names = tuple(f"{opdef.results[0]}_{i}" for i in range(len(types)))
        if len(names) != len(types):
            raise VerifyError(f"{opdef.name} has {len(types)} result(s), got {len(names)} names")
        outputs = tuple(Value(n, t) for n, t in zip(names, types))
        op = Op(
            op_type=opdef.name,
            inputs=tuple(inputs),
            outputs=outputs,
            attributes=freeze_attributes(attrs),
            device=_common_device(types),
            subfunctions=tuple(subfunctions),
            name=op_name,
        )
        self._ops.append(op)
        self._defined.update(outputs)
        return op

    def add_op_like(self, like: Op, inputs: Sequence[Value], names: Sequence[str]) -> Op:
        """Append an op like ``like`` (same type, attributes, bodies and op name) on
        ``inputs``, asking the type rule: what :meth:`add_like` does when the operands are
        not ``like``'s."""
        return self.add_op(
            like.op_type,
            inputs,
            like.attributes,
            names=names,
            subfunctions=like.subfunctions,
            op_name=like.name,
        )

    def add_like(self, like: Op, inputs: Sequence[Value], names: Sequence[str]) -> Op:
        """Append an op like ``like`` (same type, attributes, bodies and op name) on ``inputs``.

        Equal to ``add_op(like.op_type, inputs, like.attributes, names=names,
        subfunctions=like.subfunctions, op_name=like.name)``, without asking the type rule
        again when the operands have ``like``'s operand types: the results then have
        ``like``'s result types, and the new op shares its (read-only) attributes. Type
        rules depend on nothing else, so this is how a program that repeats a step (a
        pipeline stage's microbatches run the same pmap bodies and collectives) types
        each step once. ``like`` must be a verified op (one a builder added).
        """
        if self._finished:
            self._check_open()
        if not isinstance(like, Op):
            raise VerifyError(f"add_like copies an Op (one a builder added), got {like!r}")
        inputs = tuple(inputs)
        try:
            known = self._defined.issuperset(inputs)  # Values only: one C-level pass
        except TypeError:  # not hashable, so not a Value
            known = False
        if not known:
            self._check_operands(like.op_type, inputs)
        # the operand types: the same objects, as a repeated step's usually are, else equal
        same = len(inputs) == len(like.inputs)
        if same:
            for v, u in zip(inputs, like.inputs):
                if v.type is not u.type and v.type != u.type:
                    same = False
                    break
        if not same:  # not a repeat after all: the rule decides
            return self.add_op_like(like, inputs, names)
        results = like.outputs
        if len(names) != len(results):
            raise VerifyError(
                f"{like.op_type} has {len(results)} result(s), got {len(names)} names"
            )
        if len(results) == 1:
            outputs: tuple[Value, ...] = (Value(names[0], results[0].type),)
        else:
            outputs = tuple([Value(n, v.type) for n, v in zip(names, results)])
        op = Op(
            like.op_type,
            inputs,
            outputs,
            like.attributes,
            like.device,
            like.subfunctions,
            like.name,
        )
        self._ops.append(op)
        self._defined.update(outputs)
        return op

    def add_inferred(
        self,
        op_type: str,
        inputs: Sequence[Value],
        attributes: Mapping[str, Any],
        output_types: Sequence[Type],
        names: Sequence[str],
    ) -> Op:
        """Append an op whose result types were already inferred; trust them.

        The fast path for programs that add the same op to many devices' worth of
        identical operands (sharding propagation). The contract: ``attributes`` are
        the *complete* attributes that :func:`ir.verify.infer_types` returned for
        exactly these operand types, already frozen with
        :func:`ir.op.freeze_attributes` (the op keeps this very mapping, so it may be
        shared by many ops), and ``output_types`` are the types that the op's rule
        gave for them. The builder checks only what is cheap: the op exists, takes
        this many operands, has no body, the operands are defined in this builder,
        and there is one name per result. ``finish()`` does not re-check the rest;
        :func:`ir.verify.verify` does.
        """
        self.add_inferred_rows(op_type, [inputs], [(attributes, output_types)], [names])
        return self._ops[-1]

    def add_inferred_rows(
        self,
        op_type: str,
        inputs: Sequence[Sequence[Value]],
        signatures: Sequence[tuple[Mapping[str, Any], Sequence[Type]]],
        names: Sequence[Sequence[str]],
    ) -> list[tuple[Value, ...]]:
        """``add_inferred`` once per row, in one call; return each new op's results.

        Row ``i`` appends ``op_type`` on ``inputs[i]`` with ``signatures[i]`` (its frozen
        attributes and result types, under ``add_inferred``'s contract) and result names
        ``names[i]``: the same ops, in the same order, as that many ``add_inferred``
        calls (one op per device of a distributed op). Every row is checked before any op
        is added, so a row may not read another row's results; a bad row raises the error
        its ``add_inferred`` call would, and then nothing is added.
        """
        self._check_open()
        try:
            opdef = get_op(op_type)
        except UnknownOpError as e:
            raise VerifyError(str(e)) from None
        name = opdef.name
        if not len(inputs) == len(signatures) == len(names):
            raise VerifyError(
                f"{name}: {len(inputs)} operand rows, {len(signatures)} signatures and "
                f"{len(names)} name rows: give one of each per op"
            )
        defined, check_arity = self._defined, opdef.check_arity
        arity = -1  # the last operand count found right
        new_ops: list[Op] = []
        results: list[tuple[Value, ...]] = []
        values: list[Value] = []
        for row, (attributes, types), row_names in zip(inputs, signatures, names):
            if len(row) != arity:
                problem = check_arity(len(row))
                if problem:
                    raise VerifyError(problem)
                arity = len(row)
            try:
                known = defined.issuperset(row)  # Values only: one C-level pass
            except TypeError:  # not hashable, so not a Value
                known = False
            if not known:
                self._check_operands(name, row)
            if len(row_names) != len(types):
                raise VerifyError(f"{name} has {len(types)} result(s), got {len(row_names)} names")
            if len(types) == 1:
                t = types[0]
                out = Value(row_names[0], t)
                outputs: tuple[Value, ...] = (out,)
                values.append(out)
                device = t.device if type(t) is TensorType else _common_device(types)
            else:
                outputs = tuple([Value(n, t) for n, t in zip(row_names, types)])
                values.extend(outputs)
                device = _common_device(types)
            new_ops.append(Op(name, tuple(row), outputs, attributes, device, (), ""))
            results.append(outputs)
        self._ops.extend(new_ops)  # every row checked: all or nothing
        defined.update(values)
        return results

    def unpack(self, value: Value, names: Sequence[str]) -> tuple[Value, ...]:
        """Append one ``TupleGet`` per element of the tuple ``value``; return the elements.

        Equal to ``call("TupleGet", value, index=i, name=names[i])`` for every ``i``,
        without asking the type rule: each element's type is the tuple type's.
        """
        self._check_open()
        self._check_operands("TupleGet", (value,))
        elements = value.type.elements if isinstance(value.type, TupleType) else None
        if elements is None:
            raise VerifyError(f"cannot unpack {value.name!r} of type {value.type}: not a tuple")
        if len(names) != len(elements):
            raise VerifyError(
                f"{value.name!r} has {len(elements)} element(s), got {len(names)} names"
            )
        inputs, indices = (value,), self._indices
        while len(indices) < len(elements):  # read-only, so shared by this builder's ops
            indices.append(MappingProxyType({"index": len(indices)}))
        outs = tuple([Value(n, t) for n, t in zip(names, elements)])
        self._ops.extend(
            [
                Op("TupleGet", inputs, (v,), index, t.device if isinstance(t, TensorType) else None)
                for v, t, index in zip(outs, elements, indices)
            ]
        )
        self._defined.update(outs)
        return outs

    def _check_operands(self, op_type: str, inputs: Sequence[Value]) -> None:
        defined = self._defined
        for i, v in enumerate(inputs):
            try:
                known = v in defined  # only Values are: the common case needs one look-up
            except TypeError:  # not hashable, so not a Value
                known = False
            if known:
                continue
            if not isinstance(v, Value):
                raise VerifyError(f"operand {i} of {op_type} is {v!r}, not a Value")
            raise VerifyError(
                f"operand {i} of {op_type} ({v.name!r}) is not defined in function "
                f"{self.name!r} before this op"
            )

    def call(
        self,
        op_type: str,
        *inputs: Value,
        name: str | Sequence[str] | None = None,
        subfunctions: Sequence[Function] = (),
        **attributes: Any,
    ) -> Any:
        """Append an op and return its result (a Value, or a tuple of Values if several)."""
        names = [name] if isinstance(name, str) else name
        op = self.add_op(op_type, inputs, attributes, names=names, subfunctions=subfunctions)
        return op.outputs[0] if len(op.outputs) == 1 else op.outputs

    def finish(self, outputs: Sequence[Value] | Value) -> Function:
        """Close the builder and return the verified Function."""
        self._check_open()
        if isinstance(outputs, Value):
            outputs = [outputs]
        check_outputs(self.name, outputs, self._defined)
        self._finished = True
        return Function(self.name, tuple(self._inputs), tuple(self._ops), tuple(outputs))

    def _check_open(self) -> None:
        if self._finished:
            raise VerifyError(f"builder for {self.name!r} is finished; start a new one")


def _common_device(types: Sequence[Type]) -> DeviceRef:
    """The device all results live on, or None if they span several (a collective)."""
    if len(types) == 1 and type(types[0]) is TensorType:  # the common case, first
        return types[0].device
    devices = {t.device for t in types if isinstance(t, TensorType)}
    if len(devices) == 1 and not any(isinstance(t, TupleType) for t in types):
        return devices.pop()
    return None


def rebuild_op(builder: FunctionBuilder, op: Op, inputs: Sequence[Value]) -> tuple[Value, ...]:
    """Re-add ``op`` to ``builder`` with new operands, keeping type, attributes and names."""
    try:
        new = builder.add_op(
            op.op_type,
            inputs,
            dict(op.attributes),
            names=[v.name for v in op.outputs],
            subfunctions=op.subfunctions,
            op_name=op.name,
        )
    except VerifyError as e:
        raise VerifyError(f"{e}\n  while rebuilding: {describe_op(op)}") from None
    return new.outputs
