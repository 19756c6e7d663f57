"""A change's objects skip the young generations of the cyclic garbage collector,
without disturbing the user's collector settings or frozen objects."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

import ir
import workbench.session as session_module
from ir import models
from ir.sharding import Mesh, S
from workbench import Session


@pytest.fixture
def session() -> Iterator[Session]:
    was_enabled = gc.isenabled()
    gc.enable()
    yield Session(models.mlp(8, 16, 32, 4), ir.Topology.preset("a100-hgx", 4))
    if not was_enabled:
        gc.disable()


def _in_generation(obj: object, generation: int) -> bool:
    return any(o is obj for o in gc.get_objects(generation=generation))


def test_a_change_leaves_its_program_in_the_oldest_generation(session):
    assert session.annotate("wA", (Mesh((4,)), [S(1)]))
    assert gc.isenabled()
    op = session.function.ops[-1]
    assert gc.is_tracked(op)
    assert _in_generation(op, 2)
    assert not _in_generation(op, 0) and not _in_generation(op, 1)
    assert gc.get_freeze_count() == 0


def test_a_failed_change_also_turns_the_collector_back_on(session):
    assert not session.annotate("wA", (Mesh((8,)), [S(1)]))  # 8 devices on a 4-device box
    assert session.error is not None
    assert gc.isenabled()


def test_objects_frozen_by_others_stay_frozen(session):
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        assert frozen > 0
        assert session.annotate("wA", (Mesh((4,)), [S(1)]))
        assert gc.get_freeze_count() >= frozen
        assert gc.isenabled()
    finally:
        gc.unfreeze()


def test_a_collector_the_user_turned_off_stays_off(session):
    gc.disable()
    try:
        assert session.annotate("wA", (Mesh((4,)), [S(1)]))
        assert not gc.isenabled()
        op = session.function.ops[-1]
        assert not _in_generation(op, 2)  # nothing was moved either
    finally:
        gc.enable()


class _Node:
    """An object in a reference cycle (only the cyclic collector can free it)."""

    def __init__(self) -> None:
        self.me = self


def test_cycles_a_change_leaves_behind_are_freed_by_a_later_full_collection(session, monkeypatch):
    promotions = session_module._Promotions(limit=10**12)  # no full collection yet
    monkeypatch.setattr(session_module, "_PROMOTIONS", promotions)
    with session_module.long_lived_allocations():
        garbage = weakref.ref(_Node())  # a cycle nothing else refers to
    assert garbage() is not None  # moved to the oldest generation with the rest
    assert promotions.since_full > 0
    promotions.limit = promotions.since_full  # the next change crosses the limit
    assert session.annotate("wA", (Mesh((4,)), [S(1)]))
    assert garbage() is None  # collected in full
    assert promotions.since_full == 0
    assert promotions.limit >= promotions.at_least
