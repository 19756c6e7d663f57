"""Functions (the seeds' Module): inputs, ops in topological order, outputs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeVar

from .op import Op
from .types import DeviceRef, TupleType, devices_of
from .value import Value

T = TypeVar("T")


@dataclass(frozen=True, eq=False)
class Function:
    """A verified dataflow program. Build one with :class:`ir.FunctionBuilder`.

    Invariant (checked by ``FunctionBuilder.finish``): ops are in topological
    order, every value is defined once, every op fits its registry record.
    """

    name: str
    inputs: tuple[Value, ...]
    ops: tuple[Op, ...]
    outputs: tuple[Value, ...]
    # Steady-state steps: how each distributed input / output relates to the sequential
    # program's value (per tuple level, "R" or "S(k)"; None or () for none). See ir/layout.py.
    input_layouts: tuple[tuple[str, ...] | None, ...] = ()
    output_layouts: tuple[tuple[str, ...] | None, ...] = ()
    # Rank classes: groups of device ids that do identical work at identical times (a
    # 3D stage's data-parallel replicas and tensor-parallel peers), as the transform that
    # wrote the program knows them; the simulator walks a pmap body once per class.
    rank_classes: tuple[tuple[int, ...], ...] = ()

    # -- derived views (computed once; the Function never changes) ------------

    @cached_property
    def producers(self) -> dict[Value, Op]:
        """The op that defines each op-defined value."""
        return {v: op for op in self.ops for v in op.outputs}

    @cached_property
    def consumers(self) -> dict[Value, list[Op]]:
        """The ops that read each value, in program order."""
        users: dict[Value, list[Op]] = {v: [] for v in self.inputs}
        for op in self.ops:
            for v in op.outputs:
                users.setdefault(v, [])
            for v in op.inputs:
                users.setdefault(v, []).append(op)
        return users

    @cached_property
    def pmap_nesting(self) -> int:
        """How deep pmaps nest in this function: 0 without a pmap, 1 with pmaps of flat bodies."""
        return max((1 + sub.pmap_nesting for op in self.ops for sub in op.subfunctions), default=0)

    @cached_property
    def devices(self) -> tuple[DeviceRef, ...]:
        """Every concrete device the program uses, pmap bodies and device maps included,
        in first-use order."""
        seen: dict[DeviceRef, None] = {}
        for v in self.inputs:
            seen.update(dict.fromkeys(devices_of(v.type)))
        for op in self.ops:
            if op.device is not None:
                seen[op.device] = None
            for v in op.outputs:
                seen.update(dict.fromkeys(devices_of(v.type)))
            # Sub-devices of nested pmaps appear only in device maps (seed 002).
            seen.update(dict.fromkeys(_map_leaves(op.attributes.get("device_map"))))
            for sub in op.subfunctions:
                seen.update(dict.fromkeys(sub.devices))
        return tuple(d for d in seen if isinstance(d, int))

    def derived(self, key: str, make: Callable[[Function], T]) -> T:
        """``make(self)``, computed once for this function and kept with it (it never
        changes): an analysis many transforms read of one program (its batch inputs), as
        :attr:`producers` is kept. ``key`` names the analysis; ``make`` must depend on the
        function alone, and callers must not change what it returns."""
        found = self.__dict__.setdefault("_derived", {})
        if key not in found:
            found[key] = make(self)
        return found[key]

    def value(self, name: str) -> Value:
        """The input or op output named ``name`` (first match, ops inside pmap bodies excluded)."""
        for v in self.inputs:
            if v.name == name:
                return v
        for op in self.ops:
            for v in op.outputs:
                if v.name == name:
                    return v
        raise KeyError(f"function {self.name!r} has no value named {name!r}")

    def num_ops(self, *, recursive: bool = True) -> int:
        """Number of ops, counting pmap bodies once each when ``recursive``."""
        count = len(self.ops)
        if recursive:
            count += sum(sub.num_ops() for op in self.ops for sub in op.subfunctions)
        return count

    # -- comparison -----------------------------------------------------------

    def is_equivalent(self, other: Function) -> bool:
        """Structural equality up to value names (alpha-equivalence).

        Same number and types of inputs, the same ops in the same order with the
        same attributes, devices and bodies, wired the same way, and the same outputs.
        """
        return _equivalent(self, other, {})

    # -- display ----------------------------------------------------------------

    def __str__(self) -> str:
        from .text import format_function

        return format_function(self)

    def __repr__(self) -> str:
        return f"<Function {self.name!r}: {len(self.inputs)} inputs, {len(self.ops)} ops>"

    def _repr_html_(self) -> str:
        import html

        return (
            '<pre style="font-family: monospace; line-height: 1.25">'
            + html.escape(str(self))
            + "</pre>"
        )


def _equivalent(a: Function, b: Function, mapping: dict[Value, Value]) -> bool:
    if len(a.inputs) != len(b.inputs) or len(a.ops) != len(b.ops):
        return False
    if len(a.outputs) != len(b.outputs):
        return False
    for va, vb in zip(a.inputs, b.inputs):
        if va.type != vb.type:
            return False
        mapping[va] = vb
    for oa, ob in zip(a.ops, b.ops):
        if oa.op_type != ob.op_type or oa.device != ob.device:
            return False
        if _plain(oa.attributes) != _plain(ob.attributes):
            return False
        if len(oa.inputs) != len(ob.inputs) or len(oa.outputs) != len(ob.outputs):
            return False
        if any(mapping.get(x) is not y for x, y in zip(oa.inputs, ob.inputs)):
            return False
        if len(oa.subfunctions) != len(ob.subfunctions):
            return False
        for sa, sb in zip(oa.subfunctions, ob.subfunctions):
            if not _equivalent(sa, sb, dict(mapping)):
                return False
        for x, y in zip(oa.outputs, ob.outputs):
            if x.type != y.type:
                return False
            mapping[x] = y
    return all(mapping.get(x) is y for x, y in zip(a.outputs, b.outputs))


def _map_leaves(device_map: Any) -> list[Any]:
    """Every device listed in a (possibly nested) device map, keys and values."""
    if device_map is None:
        return []
    if hasattr(device_map, "items"):
        out = []
        for k, v in device_map.items():
            out.append(k)
            out += _map_leaves(v)
        return out
    if isinstance(device_map, (list, tuple)):
        return [d for x in device_map for d in _map_leaves(x)]
    return [device_map]


def _plain(v: Any) -> Any:
    """Attributes as plain, comparable Python data (mapping proxies become dicts)."""
    if isinstance(v, TupleType):
        return v
    if hasattr(v, "items"):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, tuple):
        return tuple(_plain(x) for x in v)
    return v
