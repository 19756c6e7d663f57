"""Types of DistIR values: dtypes, tensors (shape, dtype, device) and per-device tuples.

A device reference in a type is an ``int`` (a concrete device id, as in the seeds'
``Tensor[(B, F), 0]``), a :class:`DeviceVar` (``d`` bound by a pmap, ``d.1`` for a
sub-device resolved through a device map), or ``None`` (not yet assigned: the
seeds' ``?``).

Scalars are rank-0 tensors; the text format spells them ``Float[0]``, ``Int[0]``
and ``Bool[0]``.
"""

from __future__ import annotations

import enum
import functools
import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from operator import attrgetter

import ml_dtypes
import numpy as np

from .errors import InvalidTypeError
from .limits import MAX_DEVICES, MAX_ELEMENTS, MAX_INT, MAX_TUPLE_NESTING


class DType(enum.Enum):
    """Element types. The value is the name used in the text format."""

    float64 = "float64"
    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"
    int64 = "int64"
    int32 = "int32"
    bool = "bool"

    # Members are singletons compared by identity, so they may hash by identity too: the
    # C-level hash, where Enum's hashes the name in Python (cost and memo keys hold dtypes)
    __hash__ = object.__hash__

    @property
    def itemsize_bytes(self) -> int:
        return _ITEMSIZE_BYTES[self]

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype the reference executor uses for this element type."""
        return _NUMPY[self]

    @property
    def is_float(self) -> bool:
        return self in (DType.float64, DType.float32, DType.float16, DType.bfloat16)

    @staticmethod
    def from_numpy(dtype: np.dtype) -> DType:
        for member, np_dtype in _NUMPY.items():
            if np.dtype(dtype) == np_dtype:
                return member
        raise ValueError(f"no DistIR dtype for numpy dtype {dtype}")


_ITEMSIZE_BYTES = {
    DType.float64: 8,
    DType.float32: 4,
    DType.float16: 2,
    DType.bfloat16: 2,
    DType.int64: 8,
    DType.int32: 4,
    DType.bool: 1,
}

_NUMPY = {
    DType.float64: np.dtype(np.float64),
    DType.float32: np.dtype(np.float32),
    DType.float16: np.dtype(np.float16),
    DType.bfloat16: np.dtype(ml_dtypes.bfloat16),
    DType.int64: np.dtype(np.int64),
    DType.int32: np.dtype(np.int32),
    DType.bool: np.dtype(np.bool_),
}


@dataclass(frozen=True)
class DeviceVar:
    """A device variable bound by a pmap (``d``), or a sub-device of it (``d.1``).

    ``d.k`` means "the k-th device that the pmap's device map lists for the
    concrete device bound to ``d``" (seed 002): with ``device_map={1: [1, 3]}``
    and ``d = 1``, ``d.0`` is device 1 and ``d.1`` is device 3.
    """

    name: str
    sub: tuple[int, ...] = ()

    def __str__(self) -> str:
        return ".".join([self.name, *map(str, self.sub)])


DeviceRef = int | DeviceVar | None


def format_device(device: DeviceRef) -> str:
    return "?" if device is None else str(device)


@dataclass(frozen=True)
class TensorType:
    """A tensor with a concrete shape, an element type and the device it lives on."""

    shape: tuple[int, ...]
    dtype: DType = DType.float32
    device: DeviceRef = None

    def __post_init__(self) -> None:
        # One pass over the shape: builders make a TensorType for every value they add.
        shape = self.shape
        if type(shape) is not tuple:
            if not isinstance(shape, (tuple, list)):
                raise InvalidTypeError(f"tensor shape must be a tuple of ints, got {shape!r}")
            shape = tuple(shape)
            object.__setattr__(self, "shape", shape)
        elements = 1
        for d in shape:
            if type(d) is not int or d < 0 or d > MAX_INT:
                _bad_dimension(shape, d)
            elements *= d
        if elements > MAX_ELEMENTS:
            raise InvalidTypeError(
                f"a tensor of shape {shape} has {elements:.3g} elements, more than the limit "
                f"{MAX_ELEMENTS} (2**48, ir.limits.MAX_ELEMENTS)"
            )
        if type(self.dtype) is not DType:
            object.__setattr__(self, "dtype", _as_dtype(self.dtype))
        device = self.device
        if type(device) is int:
            if not 0 <= device < MAX_DEVICES:
                _bad_device(device)
        elif device is not None and type(device) is not DeviceVar:
            object.__setattr__(self, "device", _as_device(device))

    @staticmethod
    def scalar(dtype: DType = DType.float32, device: DeviceRef = None) -> TensorType:
        return TensorType((), dtype, device)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_scalar(self) -> bool:
        return not self.shape

    @property
    def num_elements(self) -> int:
        return math.prod(self.shape)

    @property
    def size_bytes(self) -> int:
        return self.num_elements * self.dtype.itemsize_bytes

    def with_device(self, device: DeviceRef) -> TensorType:
        if device == self.device:
            return self
        plain = device is None or type(device) is DeviceVar
        if not plain and not (type(device) is int and 0 <= device < MAX_DEVICES):
            return TensorType(self.shape, self.dtype, device)  # checked (and refused) there
        # this tensor's shape and dtype are checked already, the device just now: one per
        # device of a pmap is made this way, so skip the rest of __post_init__
        moved = object.__new__(TensorType)
        object.__setattr__(moved, "shape", self.shape)
        object.__setattr__(moved, "dtype", self.dtype)
        object.__setattr__(moved, "device", device)
        return moved

    def with_shape(self, shape: tuple[int, ...]) -> TensorType:
        return TensorType(tuple(shape), self.dtype, self.device)

    def __str__(self) -> str:
        return format_type(self)


def _bad_dimension(shape: tuple, d: object) -> None:
    if not isinstance(d, int) or isinstance(d, bool):
        raise InvalidTypeError(f"tensor shape must be a tuple of ints, got {shape!r}")
    if d < 0:
        raise InvalidTypeError(f"tensor shape has a negative dimension: {shape!r}")
    raise InvalidTypeError(
        f"a tensor dimension is above the limit {MAX_INT} (2**63 - 1, ir.limits.MAX_INT)"
    )


def _as_dtype(dtype: object) -> DType:
    """A DType from itself or its name (``"float32"``); anything else is an error."""
    if isinstance(dtype, str) and dtype in DType.__members__:
        return DType[dtype]
    names = ", ".join(DType.__members__)
    raise InvalidTypeError(f"tensor dtype must be a DType or one of {names}, got {dtype!r}")


def _bad_device(device: object) -> None:
    raise InvalidTypeError(
        f"a tensor's device must be a device id from 0 to {MAX_DEVICES - 1} "
        f"(ir.limits.MAX_DEVICES), a DeviceVar or None (unassigned), got {device!r}"
    )


def _as_device(device: object) -> DeviceRef:
    integral = isinstance(device, numbers.Integral) and not isinstance(device, bool)
    if integral and 0 <= device < MAX_DEVICES:
        return int(device)
    _bad_device(device)
    raise AssertionError  # not reached: _bad_device raises


@dataclass(frozen=True)
class TupleType:
    """A fixed-length tuple, usually one tensor per device (``Tuple[T@1, ..., T@N]``)."""

    elements: tuple[Type, ...]

    def __post_init__(self) -> None:
        elements = self.elements
        if type(elements) is not tuple:
            if not isinstance(elements, (tuple, list)):
                raise InvalidTypeError(f"tuple elements must be a tuple of types, got {elements!r}")
            elements = tuple(elements)
            object.__setattr__(self, "elements", elements)
        if len(elements) > MAX_DEVICES:
            raise InvalidTypeError(
                f"a tuple of {len(elements)} elements is longer than the limit {MAX_DEVICES} "
                "(ir.limits.MAX_DEVICES)"
            )
        depth = 1  # how deep tuples nest in this one, kept so that nesting is checked once
        for e in elements:
            t = type(e)
            if t is TupleType:
                depth = max(depth, e.nesting + 1)
            elif t is not TensorType and not isinstance(e, TensorType):
                if isinstance(e, TupleType):
                    depth = max(depth, e.nesting + 1)
                else:
                    raise InvalidTypeError(
                        f"tuple elements must be TensorTypes or TupleTypes, got {e!r}"
                    )
        if depth > MAX_TUPLE_NESTING:
            raise InvalidTypeError(
                f"tuples nest {depth} deep, more than the limit {MAX_TUPLE_NESTING} "
                "(ir.limits.MAX_TUPLE_NESTING)"
            )
        object.__setattr__(self, "_nesting", depth)  # not a field: no part of equality

    def __hash__(self) -> int:
        # Kept once made: the simulator and the transforms key tables by the tuple types of
        # a distributed program, thousands of elements long, which they look up per op.
        found = self.__dict__.get("_hash")
        if found is None:
            found = hash(self.elements)
            object.__setattr__(self, "_hash", found)
        return found

    def __eq__(self, other: object) -> bool:
        # Equal tuples of a distributed program are often distinct objects (one a transform
        # made, one a type rule): compare their kept hashes, then their elements' fields
        # as plain tuples (C-level), not one TensorType.__eq__ call per device.
        if self is other:
            return True
        if not isinstance(other, TupleType):
            return NotImplemented
        return hash(self) == hash(other) and self._fields == other._fields

    @property
    def _fields(self) -> tuple:
        found = self.__dict__.get("_fields_kept")
        if found is None:
            elements = self.elements
            if all(e.__class__ is TensorType for e in elements):  # C-level: map
                # a tuple per field, not one per element: three objects for the collector
                # to track, not thousands (a type of a 1,024-device step is kept per op)
                found = tuple(tuple(map(attrgetter(f), elements)) for f in _TENSOR_FIELDS)
            else:
                found = tuple(
                    (e.shape, e.dtype, e.device) if e.__class__ is TensorType else e
                    for e in elements
                )
            object.__setattr__(self, "_fields_kept", found)
        return found

    def __reduce__(self) -> tuple:
        # elements only: a kept hash (of DTypes, which hash by identity) is this process's
        return (TupleType, (self.elements,))

    @property
    def nesting(self) -> int:
        """How deep tuples nest in this one: 1 for a tuple of tensors."""
        return self._nesting

    @property
    def size_bytes(self) -> int:
        return sum(e.size_bytes for e in self.elements)

    @cached_property
    def devices(self) -> Devices:
        """Each element's device, in order (a tuple that hashes once: type rules key tables
        by the devices of tuples thousands of elements long)."""
        return Devices(getattr(e, "device", None) for e in self.elements)

    def __len__(self) -> int:
        return len(self.elements)

    def __str__(self) -> str:
        return format_type(self)


Type = TensorType | TupleType


class Devices(tuple):
    """A tuple of devices that computes its hash once (a plain tuple hashes every element
    on every look-up: a stage's tuple has up to thousands)."""

    def __hash__(self) -> int:
        try:
            return self._hash  # type: ignore[attr-defined,no-any-return]
        except AttributeError:
            self._hash = found = tuple.__hash__(self)
            return found

    def __reduce__(self) -> tuple:
        # the devices only: a kept hash (of device variables' names) is this process's
        return (Devices, (tuple(self),))


@functools.lru_cache(maxsize=4096)
def bound_tuple(t: Type, var: str, devices: Devices) -> TupleType:
    """``t`` (typed on device variable ``var``) bound to each of ``devices``, as the tuple a
    pmap over them makes of it: a tensor on ``var`` itself is :func:`uniform_tuple`'s
    one object per (tensor, devices)."""
    device = t.device if t.__class__ is TensorType else None
    if device.__class__ is DeviceVar and device.name == var and not device.sub:
        return uniform_tuple(t.with_device(None), devices)
    return TupleType(tuple(bind_type(t, var, d) for d in devices))


@functools.lru_cache(maxsize=4096)
def uniform_tuple(element: TensorType, devices: Devices) -> TupleType:
    """``element`` (a tensor of no device) on each of ``devices``: one object per (tensor,
    devices), shared by every op of a program that makes or reads such a tuple (a pmap's
    results, a stage's weights, the activations sent to the next stage; types are
    immutable values), so type rules and the simulator's tables compare a long program's
    tuples by identity, not element by element."""
    made = TupleType(tuple(element.with_device(d) for d in devices))
    made.__dict__["devices"] = devices  # its devices are the key: later look-ups by identity
    return made


_TENSOR_FIELDS = ("shape", "dtype", "device")

_SCALAR_SPELLING = {DType.float32: "Float", DType.int64: "Int", DType.bool: "Bool"}


def format_type(t: Type) -> str:
    """The text-format spelling of a type (the parser reads it back)."""
    if isinstance(t, TupleType):
        return "Tuple[" + ", ".join(format_type(e) for e in t.elements) + "]"
    device = format_device(t.device)
    if t.is_scalar and t.dtype in _SCALAR_SPELLING:
        return f"{_SCALAR_SPELLING[t.dtype]}[{device}]"
    dims = ", ".join(map(str, t.shape))
    if len(t.shape) == 1:
        dims += ","
    dtype = "" if t.dtype == DType.float32 else f", {t.dtype.value}"
    return f"Tensor[({dims}){dtype}, {device}]"


def devices_of(t: Type) -> tuple[DeviceRef, ...]:
    """Every device a value of this type occupies, in order, with repeats removed."""
    if isinstance(t, TensorType):
        return (t.device,)
    seen: dict[DeviceRef, None] = {}
    for e in t.elements:
        for d in devices_of(e):
            seen[d] = None
    return tuple(seen)


def bind_device(
    ref: DeviceRef, var: str, concrete: DeviceRef, device_map: dict | None = None
) -> DeviceRef:
    """Replace device variable ``var`` in ``ref`` by ``concrete``.

    ``var.k`` (a sub-device) becomes ``device_map[concrete][k]``; without a device
    map, or with an unassigned ``concrete``, a sub-device stays symbolic.
    """
    if not isinstance(ref, DeviceVar) or ref.name != var:
        return ref
    if not ref.sub:
        return concrete
    if device_map is None or concrete is None or concrete not in device_map:
        return ref if concrete is None else DeviceVar(str(concrete), ref.sub)
    node = device_map[concrete]
    path = [concrete]  # the devices walked down the map's tree: d, d.k, d.k.j, ...
    for i, k in enumerate(ref.sub):
        # a tree of maps (d.1.1): parsed attributes are read-only mappings, not dicts
        children = sorted(node) if isinstance(node, Mapping) else node
        if not isinstance(children, list | tuple) or not 0 <= k < len(children):
            # a map that gives fewer sub-devices than the body names (found by fuzzing)
            count = len(children) if isinstance(children, list | tuple) else 0
            where = " -> ".join(map(str, path))
            raise InvalidTypeError(
                f"device {ref} is sub-device {k} of device {where}, but the pmap's "
                f"device_map lists {count} sub-device(s) for it: "
                f"{_plain_map(device_map[concrete])!r}"
            )
        path.append(children[k])
        if isinstance(node, Mapping):
            node = node[children[k]] if i < len(ref.sub) - 1 else children[k]
        else:
            node = children[k]
    return node


def _plain_map(node: object) -> object:
    """A device map (or a subtree of one) as plain dicts and lists, for messages."""
    if isinstance(node, Mapping):
        return {k: _plain_map(v) for k, v in node.items()}
    if isinstance(node, tuple):
        return [_plain_map(v) for v in node]
    return node


def bind_type(t: Type, var: str, concrete: DeviceRef, device_map: dict | None = None) -> Type:
    """``t`` with device variable ``var`` bound to ``concrete`` everywhere inside it."""
    if isinstance(t, TupleType):
        return TupleType(tuple(bind_type(e, var, concrete, device_map) for e in t.elements))
    return t.with_device(bind_device(t.device, var, concrete, device_map))


def compute_dtype(types: Iterable[Type]) -> DType | None:
    """The dtype an op computes in: its first floating-point operand's (or result's), else
    its first tensor's (integer ids, masks), else None (tuples are looked into)."""
    first = None
    for t in types:
        while isinstance(t, TupleType) and t.elements:
            t = t.elements[0]
        if isinstance(t, TensorType):
            if t.dtype.is_float:
                return t.dtype
            first = first or t.dtype
    return first
