"""The worker processes of the torch.distributed backend: what each does on starting,
and how the parent hears of them.

A worker dies with its parent (``die_with_parent``), asks its BLAS for one thread
(one process per device shares the cores already: ``single_threaded_blas``), and
joins a world served on loopback (``ir.loopback``). While it runs, it marks
each op it starts in memory the parent reads (:class:`Progress`): a run that outlasts
its timeout names the rank that stopped making progress, and what the others wait in.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from typing import Any, ClassVar


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


__all__ = [
    "Cursor",
    "Progress",
    "WorkerExitError",
    "die_with_parent",
    "exited",
    "exited_before",
    "next_message",
    "single_threaded_blas",
    "start_all",
    "stop",
]


class Progress:
    """Where each worker is, in shared memory the workers write and the parent reads.

    Per worker: the op it runs (its index in the worker's program; -1 while it sets up,
    before its first op), whether that op waits for peers (a communication op), and
    when it started it (``time.monotonic``, one clock for every process of a machine).
    A write is three stores into a shared array, no lock and no system call: a torn
    read costs at most a stale op in a message.
    """

    SETUP, COMPUTE, COMMUNICATE, DONE = 0.0, 1.0, 2.0, 3.0
    _PHASES: ClassVar[dict[float, str]] = {
        SETUP: "setting up",
        COMPUTE: "computing",
        COMMUNICATE: "communicating",
    }

    def __init__(self, ctx: Any, workers: int) -> None:
        self._slots = ctx.RawArray("d", 3 * workers)
        now = time.monotonic()
        for w in range(workers):
            self._slots[3 * w : 3 * w + 3] = [-1.0, self.SETUP, now]

    def at(self, worker: int, index: int, communicating: bool = False) -> None:
        """In worker ``worker``: it starts op ``index`` (a communication op or not)."""
        base = 3 * worker
        self._slots[base] = index
        self._slots[base + 1] = self.COMMUNICATE if communicating else self.COMPUTE
        self._slots[base + 2] = time.monotonic()

    def done(self, worker: int) -> None:
        """In worker ``worker``: its ops are done (it waits for the others at the end)."""
        self._slots[3 * worker + 1] = self.DONE
        self._slots[3 * worker + 2] = time.monotonic()

    def index(self, worker: int) -> int:
        """The op worker ``worker`` is at (-1: setting up)."""
        return int(self._slots[3 * worker])

    def stalled(
        self, waiting: Sequence[int], names: Sequence[str], describe: Any = None
    ) -> tuple[int, str]:
        """Which of the ``waiting`` workers (not empty) stopped making progress, and a
        sentence saying so and what the others are doing; ``names[w]`` says who worker
        ``w`` is ("rank 1 (device 1)"), ``describe(w, index)`` what its op ``index`` is.

        The stalled worker is one that is not waiting for peers (it computes, or never
        finished setting up: the others are blocked on it), else, when every one waits
        for a peer, the one that has waited longest."""
        now = time.monotonic()
        rows = []
        for w in waiting:
            index, phase, since = self._slots[3 * w : 3 * w + 3]
            rows.append((w, int(index), phase, now - since))
        alone = [r for r in rows if r[2] in (self.SETUP, self.COMPUTE)]
        blocked = [r for r in rows if r[2] == self.COMMUNICATE]
        stuck = max(alone or blocked or rows, key=lambda r: r[3])

        def doing(row: tuple[int, int, float, float]) -> str:
            w, index, phase, for_s = row
            if phase == self.DONE:
                return "done with its ops, waiting for the others at the end"
            if index < 0:
                return f"setting up (joining the world) for {for_s:.1f} s"
            op = f" `{describe(w, index)}`" if describe is not None else ""
            return f"{self._PHASES[phase]} at op {index}{op} for {for_s:.1f} s"

        if alone:
            head = f"{names[stuck[0]]} stopped making progress, {doing(stuck)}"
        else:  # nobody computes: which one is to blame, the messages cannot say
            head = (
                "every rank left waits for a peer (a deadlock, or a message nobody sends); "
                f"longest {names[stuck[0]]}, {doing(stuck)}"
            )
        others = [f"{names[r[0]]} is {doing(r)}" for r in rows if r is not stuck]
        return stuck[0], head + ("; " + "; ".join(others) if others else "")


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


def exited_before(
    procs: list, skip: Collection[int] = (), grace_s: float = 0.3
) -> WorkerExitError | None:
    """:func:`exited`, after waiting up to ``grace_s`` for one to end: called when a worker
    reports an error, which may be its peer's death seen first (Linux closes a dying
    process's sockets before its parent can see its exit status)."""
    deadline = time.monotonic() + grace_s
    while True:
        dead = exited(procs, skip)
        if dead is not None or time.monotonic() >= deadline:
            return dead
        time.sleep(0.01)


def next_message(
    outbox, procs: list, deadline: float, skip: Collection[int] = (), poll_s: float = 0.2
):
    """The next message from the workers, waiting until ``deadline`` (``time.monotonic``)
    but no longer than a dead worker leaves the rest waiting: raises
    :class:`WorkerExitError` for a worker (not in ``skip``) that died (:func:`exited`),
    ``queue.Empty`` at the deadline."""
    import queue
    import time

    from ..interrupt import check

    while True:
        check()  # a dashboard's Cancel: the caller's cleanup stops the workers
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


class Cursor:
    """The op one worker runs (``op``: what its error message names), also marked in the
    parent's :class:`Progress` (``worker``: this worker's slot there) when there is one."""

    __slots__ = ("_progress", "_worker", "op")

    def __init__(self, progress: Progress | None = None, worker: int = 0) -> None:
        self.op: Any = None
        self._progress, self._worker = progress, worker

    def at(self, index: int, op: Any, communicating: bool = False) -> None:
        """This worker starts ``op``, its op ``index`` (one that waits for peers or not)."""
        self.op = op
        if self._progress is not None:
            self._progress.at(self._worker, index, communicating)

    def done(self) -> None:
        """This worker's ops are done."""
        self.op = None
        if self._progress is not None:
            self._progress.done(self._worker)


def start_all(procs: list, world: Any) -> None:
    """Start the worker processes, then serve their world (``ir.loopback``:
    after the forks, so no store thread runs while the parent forks); if any fails to
    start, the ones started are stopped."""
    started = []
    try:
        for p in procs:
            p.start()
            started.append(p)
        world.serve()
    except BaseException:
        stop(started, {})
        raise
