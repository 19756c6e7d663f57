"""A small mapping that keeps the entries used last: what the session and the dashboard
keep of past states stays bounded however long a session runs (their objects would
otherwise pile up, and every full collection of the garbage collector walks them)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["KEEP", "Lru"]

# States kept: Undo and Redo back and forth, the previous state to compare with, a search's
# two picks. Each derived state holds some 10,000 objects (its program, simulation and
# propagation report, benchmarks/bench_gc_pauses.py), and every full collection of the
# garbage collector visits all of them: more would lengthen each such pause.
KEEP = 6

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Lru(Generic[K, V]):
    """A mapping that keeps the ``size`` entries used last.

    >>> lru = Lru(2)
    >>> lru.get("a", lambda: 1), lru.get("b", lambda: 2), lru.get("a", lambda: 9)
    (1, 2, 1)
    >>> lru.get("c", lambda: 3), list(lru.keys())
    (3, ['a', 'c'])
    """

    def __init__(self, size: int = KEEP) -> None:
        self.size = size
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K, make: Callable[[], V]) -> V:
        """The entry for ``key``, made by ``make()`` when missing."""
        if key in self._items:
            self._items.move_to_end(key)
            return self._items[key]
        value = make()
        self.put(key, value)
        return value

    def find(self, key: K) -> V | None:
        if key in self._items:
            self._items.move_to_end(key)
            return self._items[key]
        return None

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def keys(self) -> list[K]:
        return list(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)
