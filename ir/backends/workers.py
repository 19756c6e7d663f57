"""The worker processes of the torch.distributed backend: what each does on starting.

A worker dies with its parent (``die_with_parent``), asks its BLAS for one thread
(one process per device shares the cores already: ``single_threaded_blas``), and
joins a gloo world through a port the OS picked (``free_port``, never a fixed one).
"""

from __future__ import annotations

import socket


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


__all__ = ["die_with_parent", "free_port", "single_threaded_blas"]


def stop(procs: list, results: dict) -> None:
    """Join the worker processes; if any gave no result, kill them all first: the others
    would wait on a rank that is gone."""
    failed = len(results) < len(procs)
    for p in procs:
        if failed:
            p.kill()
        p.join(timeout=10)
