"""Tuples over thousands of devices are typed by identity: a tuple's devices hash once and a
pmap's results over them are one shared type object per (type, devices)."""

from __future__ import annotations

import pickle

from ir import DeviceVar, FunctionBuilder, TensorType, TupleType
from ir.types import Devices, bound_tuple


def test_devices_are_a_tuple_that_hashes_once_and_pickles_without_its_hash():
    t = TupleType(tuple(TensorType((2, 3), device=d) for d in range(5)))
    assert t.devices == (0, 1, 2, 3, 4) and hash(t.devices) == hash((0, 1, 2, 3, 4))
    assert t.devices is t.devices  # kept with its tuple
    again = pickle.loads(pickle.dumps(t.devices))
    assert type(again) is Devices and again == t.devices and "_hash" not in vars(again)


def test_a_pmap_over_a_bound_tuple_makes_the_same_tuple_objects():
    d = DeviceVar("d")
    body_b = FunctionBuilder("body")
    x = body_b.input("x", TensorType((4, 8), device=d))
    body = body_b.finish([body_b.call("Relu", x, name="y")])
    devices = Devices(range(6))
    xs_type = bound_tuple(TensorType((4, 8), device=d), "d", devices)
    assert xs_type == TupleType(tuple(TensorType((4, 8), device=k) for k in range(6)))
    b = FunctionBuilder("f")
    xs = b.input("xs", xs_type)
    first = b.add_op("Pmap", [xs], {"device_var": "d"}, names=["y"], subfunctions=[body])
    second = b.add_op("Pmap", first.outputs, {"device_var": "d"}, names=["z"], subfunctions=[body])
    # a body's tensor on the pmap's own devices: its input's tuple type, the very object
    assert first.outputs[0].type is xs_type and second.outputs[0].type is xs_type
    b.finish(second.outputs)
