"""Rank classes: ranks whose programs differ only in rank parameters share one program.

Two ranks of a data-parallel group, or the same stage of two pipeline replicas,
run the same ops on the same shapes; what differs is where their block starts
(``Slice`` offsets), whom they talk to (``SendTo`` / ``RecvFrom`` peers, a
``RankCollective``'s group) and the tags that match messages. Those attributes
are the rank's *parameters* (:func:`rank_parameters`: each op record's
``extra["rank_parameters"]``): a rank class is one
program plus, per rank, the values of its parameters where they differ from the
class program's, so N identical ranks give one program, not N (the RFC's
"eliminate redundant ranked IRs", parametrised by the rank's place in the mesh).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..function import Function, _plain
from ..op import Op, freeze_attributes
from ..registry import get_op
from ..value import Value


def rank_parameters(op_type: str) -> tuple[str, ...]:
    """The attributes of ``op_type`` that may differ between the ranks of one class: its
    registry record's ``extra["rank_parameters"]`` (a Slice's offsets, a SendTo's peer and
    tag, ...)."""
    return get_op(op_type).extra.get("rank_parameters", ())


Parameters = dict[tuple[int, str], Any]


def parameters_against(template: Function, program: Function) -> Parameters | None:
    """``program``'s rank parameters where they differ from ``template``'s, or None when the
    two differ in anything else (ops, wiring, types, other attributes)."""
    a, b = template, program
    if (len(a.inputs), len(a.ops), len(a.outputs)) != (len(b.inputs), len(b.ops), len(b.outputs)):
        return None
    mapping: dict[Value, Value] = {}
    for va, vb in zip(a.inputs, b.inputs):
        if va.type != vb.type:
            return None
        mapping[va] = vb
    found: Parameters = {}
    for index, (oa, ob) in enumerate(zip(a.ops, b.ops)):
        if oa.op_type != ob.op_type or oa.device != ob.device:
            return None
        if len(oa.inputs) != len(ob.inputs) or len(oa.outputs) != len(ob.outputs):
            return None
        if any(mapping.get(x) is not y for x, y in zip(oa.inputs, ob.inputs)):
            return None
        if oa.subfunctions != ob.subfunctions:  # lowering passes bodies through as they are
            return None
        free = rank_parameters(oa.op_type)
        pa, pb = _plain(oa.attributes), _plain(ob.attributes)
        if {k: v for k, v in pa.items() if k not in free} != {
            k: v for k, v in pb.items() if k not in free
        }:
            return None
        for key in free:
            if pa.get(key) != pb.get(key):
                found[(index, key)] = ob.attributes[key]
        for x, y in zip(oa.outputs, ob.outputs):
            if x.type != y.type:
                return None
            mapping[x] = y
    if any(mapping.get(x) is not y for x, y in zip(a.outputs, b.outputs)):
        return None
    return found


def classes(
    programs: Mapping[int, Function],
) -> tuple[tuple[Function, ...], dict[int, int], dict[int, Parameters]]:
    """Group ``programs`` (rank -> program) into classes: the class programs (each its
    first rank's), each rank's class, and each rank's parameters against its class."""
    unique: list[Function] = []
    dedup: dict[int, int] = {}
    parameters: dict[int, Parameters] = {}
    for r, prog in sorted(programs.items()):
        for i, u in enumerate(unique):
            found = parameters_against(u, prog)
            if found is not None:
                dedup[r], parameters[r] = i, found
                break
        else:
            dedup[r], parameters[r] = len(unique), {}
            unique.append(prog)
    return tuple(unique), dedup, parameters


def instantiate(template: Function, parameters: Mapping[tuple[int, str], Any]) -> Function:
    """``template`` with ``parameters`` ({(op index, attribute): value}) set: one rank's program.

    The parameters never change a value's type (offsets move a block of the same size,
    peers and tags name other ranks), so the values are the template's own.
    """
    if not parameters:
        return template
    ops = list(template.ops)
    by_op: dict[int, dict[str, Any]] = {}
    for (index, key), value in parameters.items():
        if key not in rank_parameters(ops[index].op_type):
            raise KeyError(f"{key!r} is not a rank parameter of {ops[index].op_type}")
        by_op.setdefault(index, {})[key] = value
    for index, changes in by_op.items():
        op = ops[index]
        attrs = {**_plain(op.attributes), **changes}
        ops[index] = Op(
            op.op_type,
            op.inputs,
            op.outputs,
            freeze_attributes(attrs),
            op.device,
            op.subfunctions,
            op.name,
        )
    return Function(template.name, template.inputs, tuple(ops), template.outputs)


__all__ = ["classes", "instantiate", "parameters_against", "rank_parameters"]
