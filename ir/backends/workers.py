"""The worker processes of the torch.distributed backend: what each does on starting.

A worker dies with its parent (``die_with_parent``), asks its BLAS for one thread
(one process per device shares the cores already: ``single_threaded_blas``), and
joins a gloo world through a port the OS picked (``free_port``, never a fixed one).
"""

from __future__ import annotations

import socket
from collections.abc import Collection


def die_with_parent(parent: int) -> None:
    """Ask Linux to kill this worker when its parent dies, even by SIGKILL (a worker left
    behind holds its memory and its port); without prctl, nothing changes."""
    import ctypes
    import os
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def single_threaded_blas() -> None:
    """Ask numpy's OpenBLAS for one thread in this process, if it is OpenBLAS.

    One process per device shares the cores already; a multi-threaded kernel in each
    waits for whichever of its threads the others have descheduled (milliseconds on a
    busy machine). Without OpenBLAS (or a known symbol) nothing changes.
    """
    import ctypes

    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower()}
    except OSError:
        return
    for path in paths:
        lib = ctypes.CDLL(path)
        for name in ("openblas_set_num_threads", "scipy_openblas_set_num_threads64_"):
            if hasattr(lib, name):
                getattr(lib, name)(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


__all__ = [
    "WorkerExitError",
    "die_with_parent",
    "exited",
    "free_port",
    "next_message",
    "single_threaded_blas",
    "stop",
]


class WorkerExitError(Exception):
    """A worker process ended without saying why (killed, out of memory, a crash in C):
    ``index`` is its position in the list of processes, ``how`` how it ended."""

    def __init__(self, index: int, how: str) -> None:
        super().__init__(f"worker {index} {how}")
        self.index, self.how = index, how


def exited(procs: list, skip: Collection[int] = ()) -> WorkerExitError | None:
    """The first worker (by index, but those in ``skip``: the ones heard from) that has
    ended with a failure status, or None.

    A worker reports its own exceptions and ends with status 0 once it has put its last
    message; a non-zero status means it died without a word: the others, waiting on it
    in a collective, then fail (gloo: "Connection reset by peer") or wait forever."""
    import signal

    for i, p in enumerate(procs):
        code = p.exitcode
        if not code or i in skip:
            continue
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = str(-code)
            hint = " (the kernel's out-of-memory killer?)" if -code == signal.SIGKILL else ""
            how = f"was killed by signal {name}{hint}"
        else:
            how = f"exited with status {code}"
        return WorkerExitError(i, f"(pid {p.pid}) {how} before sending its result")
    return None


def next_message(
    outbox, procs: list, deadline: float, skip: Collection[int] = (), poll_s: float = 0.5
):
    """The next message from the workers, waiting until ``deadline`` (``time.monotonic``)
    but no longer than a dead worker leaves the rest waiting: raises
    :class:`WorkerExitError` for a worker (not in ``skip``) that died (:func:`exited`),
    ``queue.Empty`` at the deadline."""
    import queue
    import time

    while True:
        left = deadline - time.monotonic()
        try:
            return outbox.get(timeout=max(0.01, min(poll_s, left)))
        except queue.Empty:
            dead = exited(procs, skip)
            if dead is not None:
                raise dead from None
            if time.monotonic() >= deadline:
                raise


def stop(procs: list, results: dict) -> None:
    """Join the worker processes; if any gave no result, kill them all first: the others
    would wait on a rank that is gone."""
    failed = len(results) < len(procs)
    for p in procs:
        if failed:
            p.kill()
        p.join(timeout=10)
