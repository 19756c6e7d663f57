"""The engine's value slots and rank classes: :class:`SlotTable`.

A slot is one tensor on one device: allocated when its producer starts, ready when it
ends, freed after its last reader (``ir.sim.memory``). A tuple value is a tuple of
slots. The devices of a rank class do identical work at identical times, so an element
of a tuple on a class member shares its representative's slot: a value over a 3D
stage's ``dp * tp`` devices holds one slot per class, and the walk that makes it
touches the class once. Per flat tuple type the table keeps a :class:`Layout` (the
elements' devices, the positions that stand for themselves, how to assemble a value
from their slots), found once per type and pmap scope, so that the per-op cost of a
value over thousands of devices is a lookup and a C-level tuple build.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import Any

from ..device import Topology
from ..types import TensorType, TupleType, Type


class UnknownDeviceError(Exception):
    def __init__(self, ref: Any) -> None:
        self.ref = ref


def element(value: Any, k: int) -> Any:
    """Element ``k`` of a tuple value: a tuple of slots, or a rank class's one slot ``s``
    kept as the int ``~s`` (negative: every element holds ``s``; an int, so that the
    values of a long walk are nothing the cyclic GC scans)."""
    if value.__class__ is int:
        return ~value
    return value[k]


class Layout:
    """A flat tuple type's elements under one pmap scope: ``where[k]`` the device index
    of element ``k``; ``reps`` the elements that stand for themselves (each other
    element shares the slot of the element on its class representative);
    :meth:`assemble` the tuple value from one entry per element of ``reps`` (a single
    class's one slot ``s`` as ``~s``: see :func:`element`)."""

    __slots__ = ("_get", "_n", "_single", "reps", "where")

    def __init__(self, where: tuple[int, ...], owners: Sequence[int] | None):
        self.where = where
        n = len(where)
        if owners is None:
            self.reps = tuple(range(n))
            self._get = None
        else:
            self.reps = tuple(k for k in range(n) if owners[k] == k)
            ordinal = {k: i for i, k in enumerate(self.reps)}
            self._get = itemgetter(*[ordinal[o] for o in owners]) if n > 1 else None
        self._single = n == 1 or len(self.reps) == 1
        self._n = n

    def assemble(self, values: list) -> Any:
        if self._single:  # one element, or one class: its slot for each
            value = values[0]
            return ~value if value.__class__ is int else (value,) * self._n
        if self._get is None:
            return tuple(values)
        return self._get(values)


class SlotTable:
    """Slot columns, rank classes and tuple layouts (the base of ``ir.sim.engine.Engine``)."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.index_of = {d.device_id: i for i, d in enumerate(topology.devices)}
        # Flat columns of numbers and shared objects, no per-op containers: the cyclic GC,
        # paused during the walk, would otherwise scan every one of them once it resumes.
        self.slot_ready: list[float] = []
        self.slot_bytes: list[int] = []
        self.slot_device: list[int] = []
        self.slot_producer: list[int] = []  # producer unit, or -1 for a function input
        self._layouts: dict[tuple, Layout | None] = {}

    # -- rank classes -------------------------------------------------------

    def _set_classes(self, classes: Sequence[Sequence[int]], model_of: Sequence[int]) -> None:
        """``rep_of[i]``: the device index whose walk stands for device index ``i``.

        The devices of a class (of one hardware model) do identical work at identical
        times, so a pmap body runs on the first of them only, and the others' slots are
        the first's (their events and memory curves are the first's; see SimResult).
        """
        self.rep_of = list(range(len(self.topology.devices)))
        for group in classes:
            by_model: dict[int, list[int]] = {}
            for d in group:
                i = self.index_of.get(d)
                if i is not None:
                    by_model.setdefault(model_of[i], []).append(i)
            for members in by_model.values():
                rep = min(members)
                for i in members:
                    self.rep_of[i] = rep
        self.mirrored = any(r != i for i, r in enumerate(self.rep_of))
        self._owners: dict[tuple[int, ...], tuple[int, ...] | None] = {}

    def owners(self, devices: tuple[int, ...]) -> tuple[int, ...] | None:
        """For a tuple whose elements live on device indices ``devices``: the position whose
        value stands for each element (its class representative's), or None if each
        element stands for itself."""
        found = self._owners.get(devices, False)
        if found is not False:
            return found
        rep_of = self.rep_of
        position: dict[int, int] = {}
        for k, d in enumerate(devices):
            position.setdefault(d, k)
        owners = tuple(position.get(rep_of[d], k) for k, d in enumerate(devices))
        result = None if all(o == k for k, o in enumerate(owners)) else owners
        self._owners[devices] = result
        return result

    def layout(self, t: TupleType, scope: Any) -> Layout | None:
        """The :class:`Layout` of flat tuple type ``t`` under ``scope`` (None if ``t``
        nests tuples); raises UnknownDeviceError for a device the topology lacks."""
        key = (t, scope.key)  # a tuple type keeps its hash; equal ones compare at C level
        found = self._layouts.get(key, False)
        if found is not False:
            return found
        found = None
        if all(e.__class__ is TensorType for e in t.elements):
            where = tuple([scope[d] for d in t.devices])
            found = Layout(where, self.owners(where) if self.mirrored else None)
        self._layouts[key] = found
        return found

    # -- new slots -------------------------------------------------------------

    def new_slots(self, t: Type, scope: Any, ready: float, producer: int) -> Any:
        """The slots of a new value of type ``t`` (an int, or nested tuples of ints)."""
        if t.__class__ is TensorType:
            self.slot_ready.append(ready)
            self.slot_bytes.append(t.size_bytes)
            self.slot_device.append(scope[t.device])
            self.slot_producer.append(producer)
            return len(self.slot_ready) - 1
        layout = self.layout(t, scope)
        if layout is None:  # nested tuples
            return tuple(self.new_slots(e, scope, ready, producer) for e in t.elements)
        first = len(self.slot_ready)
        reps = layout.reps
        n = len(reps)
        self.slot_ready.extend([ready] * n)
        elements = t.elements
        self.slot_bytes.extend([elements[k].size_bytes for k in reps])
        where = layout.where
        self.slot_device.extend([where[k] for k in reps])
        self.slot_producer.extend([producer] * n)
        return layout.assemble(list(range(first, first + n)))


def unique_leaves(slots: Any) -> list[int]:
    """The distinct slots of a value (an int, or nested tuples of ints), in first order."""
    if slots.__class__ is int:
        return [slots if slots >= 0 else ~slots]  # ~s: a class's one slot (see element)
    if slots and slots[0].__class__ is int:
        try:
            if min(slots) >= 0:  # a flat tuple of slots: C-level passes
                return list(dict.fromkeys(slots))
        except TypeError:
            pass
    out: dict[int, None] = {}
    for x in slots:
        out.update(dict.fromkeys(unique_leaves(x)))
    return list(out)


def leaves_of(values: list) -> list[int]:
    """The distinct slots of several values."""
    if len(values) == 1:
        return unique_leaves(values[0])
    out: dict[int, None] = {}
    for v in values:
        out.update(dict.fromkeys(unique_leaves(v)))
    return list(out)
