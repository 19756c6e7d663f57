"""Cooperative cancellation of long work run in a thread (a dashboard's search or
measurement): the thread's owner sets an event, and the work stops at its next safe point
by raising ``KeyboardInterrupt`` there, as Ctrl-C would stop it in a script.

An exception injected into a running thread from outside can land anywhere, including
between a lock's acquire and its ``try`` (the ``logging`` module's lock, for one), and
leave that lock held for ever; so nothing is injected. Long work calls :func:`check` where
stopping is safe (between strategies of a search, while waiting for worker processes),
and the owner runs it under :func:`cancellable`:

>>> import threading
>>> stop = threading.Event()
>>> with cancellable(stop):
...     check()          # not asked to stop: returns
...     stop.set()
...     try:
...         check()
...     except KeyboardInterrupt:
...         print("stopped at a safe point")
stopped at a safe point
>>> check()              # outside: never stops
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["cancellable", "check"]

_local = threading.local()


@contextmanager
def cancellable(stop: threading.Event) -> Iterator[None]:
    """Run the block so that :func:`check`, called in this thread, raises
    ``KeyboardInterrupt`` once ``stop`` is set (nested blocks: the innermost event)."""
    outer = getattr(_local, "stop", None)
    _local.stop = stop
    try:
        yield
    finally:
        _local.stop = outer


def check() -> None:
    """Raise ``KeyboardInterrupt`` if this thread's work was asked to stop."""
    stop = getattr(_local, "stop", None)
    if stop is not None and stop.is_set():
        raise KeyboardInterrupt
