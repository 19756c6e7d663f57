"""Measure this machine and fit the simulator's models to it: :func:`calibrate`.

What is measured (each the fastest of a few runs: the least disturbed on a shared
machine):

* matmul: ``n x n`` products in float32 and float64 with numpy, and with torch
  when it is installed (``2 n^3`` flops each);
* vector work: ``np.add`` on arrays that fit the cache (one flop per element);
* memory: ``np.copyto`` of several sizes (bytes read plus bytes written);
* communication: two local processes in a torch.distributed gloo group on
  loopback (``ir/_gloo_worker.py``; the port comes from the OS), one-way
  send/recv and all-reduce at several message sizes.

Every series is fitted with one model, ``time = alpha + x / rate``
(:func:`fit_alpha_beta`, least squares on relative error): for matmuls ``x`` is
flops and ``rate`` the peak, for copies and messages ``x`` is bytes and ``rate``
the bandwidth; ``alpha`` is the fixed cost (launch overhead, latency). The
result keeps the samples, the fits and each sample's relative residual, and
builds a matching :class:`Topology` (:meth:`Calibration.topology`) whose
devices have matrix and vector peaks per dtype.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .device import Device, Topology
from .errors import DistIRError
from .interrupt import check
from .loopback import Rendezvous, loopback_environment

GB = 1e9


class CalibrationError(DistIRError):
    """A measurement that failed: the gloo processes did not finish, a fit is degenerate."""


@dataclass(frozen=True)
class Sample:
    """One measurement: ``x`` units of work (``unit``: flops or bytes) took ``time_s``."""

    kind: str  # "matmul", "vector", "copy", "send" or "allreduce"
    backend: str  # "numpy", "torch" or "gloo"
    dtype: str
    x: float
    unit: str
    time_s: float

    @property
    def series(self) -> str:
        return f"{self.kind}/{self.backend}/{self.dtype}"


@dataclass(frozen=True)
class AlphaBeta:
    """``time_s(x) = alpha_s + x / rate_per_s``: rate in ``unit`` (flops or bytes) per second."""

    alpha_s: float
    rate_per_s: float
    unit: str = "bytes"

    def time_s(self, x: float) -> float:
        return self.alpha_s + x / self.rate_per_s


def fit_alpha_beta(x: Sequence[float], times_s: Sequence[float], unit: str = "bytes") -> AlphaBeta:
    """Least-squares fit of ``time = alpha + x / rate``, each sample weighted by ``1/time``
    (relative error: small and large sizes count alike). Exact data gives exact figures:

    >>> fit = fit_alpha_beta([1e3, 1e6, 1e9], [1e-5 + 1e3 / 2e9, 1e-5 + 1e6 / 2e9, 1e-5 + 0.5])
    >>> round(fit.alpha_s * 1e6, 9), round(fit.rate_per_s / 1e9, 9)
    (10.0, 2.0)
    """
    xs, ts = np.asarray(x, dtype=float), np.asarray(times_s, dtype=float)
    if xs.shape != ts.shape or len(xs) < 2 or len(set(xs.tolist())) < 2:
        raise CalibrationError(
            f"an alpha-beta fit needs two or more distinct sizes, got {list(xs)}"
        )
    if not (ts > 0).all():
        raise CalibrationError(f"measured times must be positive, got {list(ts)}")
    a = np.stack([np.ones_like(xs), xs], axis=1) / ts[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(a, np.ones_like(ts), rcond=None)
    if not beta > 0:
        raise CalibrationError(
            f"times do not grow with size ({unit} {list(xs)}, seconds {list(ts)}): the machine "
            "was too busy to measure; run again, or with larger sizes"
        )
    return AlphaBeta(float(alpha), float(1.0 / beta), unit)


@dataclass(frozen=True)
class CalibrationOptions:
    """What :func:`calibrate` measures; :meth:`quick` is the short set tests use."""

    matmul_sizes: tuple[int, ...] = (64, 128, 256, 512)
    matmul_dtypes: tuple[str, ...] = ("float32", "float64")
    vector_elements: tuple[int, ...] = (2**12, 2**14, 2**16)
    copy_bytes: tuple[int, ...] = (2**26, 2**27, 2**28)  # beyond the caches
    message_bytes: tuple[int, ...] = (2**12, 2**16, 2**20, 2**22)
    budget_s: float = 0.25  # per measurement, beyond its minimum repeats
    repeats: int = 5
    use_torch: bool = True
    # torch's matmul threads while measuring (None: its default). One: a process per core,
    # as the gloo ranks run; and on a shared machine a multi-threaded kernel waits for
    # whichever of its threads another job has descheduled (a 4-12 ms scheduler quantum)
    torch_threads: int | None = 1
    communication: bool = True
    timeout_s: float = 60.0  # for the gloo processes, start to finish

    @staticmethod
    def quick() -> CalibrationOptions:
        return CalibrationOptions(
            matmul_sizes=(64, 128, 256),
            vector_elements=(2**12, 2**15),
            copy_bytes=(2**25, 2**26, 2**27),
            message_bytes=(2**12, 2**18, 2**21),
            budget_s=0.06,
            repeats=3,
            timeout_s=30.0,
        )


@dataclass(frozen=True)
class Calibration:
    """Samples, fits and residuals of one :func:`calibrate` run.

    ``fits`` maps a series (``"matmul/numpy/float32"``, ``"copy/numpy/uint8"``,
    ``"send/gloo/float32"``, ...) to its :class:`AlphaBeta`; ``residuals`` holds
    ``(predicted - measured) / measured`` per sample, in ``samples`` order.
    """

    samples: tuple[Sample, ...]
    fits: dict[str, AlphaBeta]
    residuals: tuple[float, ...]
    memory_bytes: float
    notes: tuple[str, ...] = field(default=())

    @property
    def matrix_peak_flops(self) -> dict[str, float]:
        """Per dtype, the fastest backend's fitted matmul rate."""
        return self._best("matmul")

    @property
    def vector_peak_flops(self) -> dict[str, float]:
        return self._best("vector")

    @property
    def memory(self) -> AlphaBeta:
        """Copies: alpha is the per-call (launch) overhead, rate the memory bandwidth."""
        return self.fits["copy/numpy/uint8"]

    @property
    def link(self) -> AlphaBeta | None:
        """One-way gloo send between two local processes, if it was measured."""
        return self.fits.get("send/gloo/float32")

    def _best(self, kind: str) -> dict[str, float]:
        best: dict[str, float] = {}
        for series, fit in self.fits.items():
            k, _, dtype = series.split("/")
            if k == kind:
                best[dtype] = max(best.get(dtype, 0.0), fit.rate_per_s)
        return best

    def comm_mode(self, num_devices: int, cores: int | None = None) -> str:
        """:func:`comm_mode` of ``num_devices`` processes on this machine."""
        return comm_mode(num_devices, cores)

    def topology(self, num_devices: int = 1) -> Topology:
        """``num_devices`` devices like this machine: processes linked as gloo links them
        (by memory copies when communication was not measured).

        The headline ``peak_flops`` is the float32 matmul rate (a CPU has no
        half-precision matrix units); ``launch_overhead_s`` the vector adds' alpha
        (numpy's per-call cost: the copies' alpha is lost in their large sizes).
        """
        matrix, vector = self.matrix_peak_flops, self.vector_peak_flops
        vector_fit = self.fits.get("vector/numpy/float32") or next(
            f for k, f in self.fits.items() if k.startswith("vector/")
        )
        launch_s = max(0.0, vector_fit.alpha_s)
        link = self.link or self.memory
        devices = tuple(
            Device(
                i,
                "cpu",
                peak_flops=matrix.get("float32", max(matrix.values())),
                mem_bandwidth_bytes_per_s=self.memory.rate_per_s,
                memory_bytes=self.memory_bytes,
                launch_overhead_s=launch_s,
                matrix_peak_flops=matrix,
                vector_peak_flops=vector,
            )
            for i in range(num_devices)
        )
        n = num_devices
        bandwidth = tuple(
            tuple(0.0 if i == j else link.rate_per_s for j in range(n)) for i in range(n)
        )
        latency = tuple(
            tuple(0.0 if i == j else max(0.0, link.alpha_s) for j in range(n)) for i in range(n)
        )
        return Topology(devices, bandwidth, latency, name=f"calibrated-cpu-{n}")

    def summary_markdown(self) -> str:
        """The fits and the worst residual of each series, as a Markdown table."""
        rows = ["| series | alpha | rate | worst residual |", "|---|---|---|---|"]
        for series, fit in self.fits.items():
            worst = max(abs(r) for s, r in zip(self.samples, self.residuals) if s.series == series)
            rate = f"{fit.rate_per_s / 1e9:.3g} G{fit.unit}/s"
            rows.append(f"| {series} | {fit.alpha_s * 1e6:.3g} us | {rate} | {worst:.1%} |")
        return "\n".join(rows) + "\n"


def comm_mode(num_devices: int, cores: int | None = None) -> str:
    """The ``ir.simulate(comm=...)`` that ``num_devices`` processes on this machine (or on
    ``cores`` cores) need: ``"blocking"`` when they leave no core free for their
    communication (each process computing on one core and gloo's copies and reductions
    needing another: ``2 n > cores``), else ``"channels"`` (communication hides behind
    compute).

    >>> comm_mode(2, cores=2), comm_mode(2, cores=8)
    ('blocking', 'channels')
    """
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    cores = cores or os.cpu_count() or 1
    return "blocking" if 2 * num_devices > cores else "channels"


def calibrate(
    options: CalibrationOptions | None = None, *, quick: bool = False, progress: bool = True
) -> Calibration:
    """Measure this machine (about 20 s; ``quick=True``: under 10 s) and fit its models.

    ``options`` chooses what is measured (``quick`` picks :meth:`CalibrationOptions.quick`);
    ``progress`` shows a ``tqdm`` bar. Communication needs torch with gloo; without
    torch it is skipped and said so in ``notes``.
    """
    from tqdm.auto import tqdm

    opts = options or (CalibrationOptions.quick() if quick else CalibrationOptions())
    torch = _torch() if opts.use_torch or opts.communication else None
    notes = [] if torch is not None else ["torch is not installed: numpy only, no gloo links"]
    backends = ["numpy", *(["torch"] if torch is not None and opts.use_torch else [])]
    steps = len(backends) * len(opts.matmul_dtypes) + len(opts.matmul_dtypes) + 1
    with_comm = opts.communication and torch is not None
    samples: list[Sample] = []
    with tqdm(total=steps + with_comm, desc="calibrating", disable=not progress) as bar:
        for backend in backends:
            for dtype in opts.matmul_dtypes:
                bar.set_postfix_str(f"{backend} {dtype} matmul")
                samples += _matmuls(backend, dtype, opts, torch)
                bar.update()
        for dtype in opts.matmul_dtypes:
            bar.set_postfix_str(f"{dtype} vector add")
            samples += _vector_adds(dtype, opts)
            bar.update()
        bar.set_postfix_str("memory copies")
        samples += _copies(opts)
        bar.update()
        if with_comm:
            bar.set_postfix_str("gloo send / all-reduce, 2 processes")
            samples += _gloo(opts)
            bar.update()
    return _fitted(samples, tuple(notes))


def _fitted(samples: Sequence[Sample], notes: tuple[str, ...] = ()) -> Calibration:
    series: dict[str, list[Sample]] = {}
    for s in samples:
        series.setdefault(s.series, []).append(s)
    fits = {}
    for name, group in series.items():
        fits[name], dropped = _robust_fit(group)
        if dropped:
            shown = ", ".join(f"{s.x:.3g} {s.unit}" for s in dropped)
            notes = (
                *notes,
                f"{name}: left out of the fit as disturbed (over 2x slower than the fit "
                f"of the others): {shown}",
            )
    residuals = tuple((fits[s.series].time_s(s.x) - s.time_s) / s.time_s for s in samples)
    return Calibration(tuple(samples), fits, residuals, _memory_bytes(), notes)


def _robust_fit(group: list[Sample]) -> tuple[AlphaBeta, list[Sample]]:
    """:func:`fit_alpha_beta`, leaving out samples the rest predict at under half their
    time (a thread descheduled by another job on a shared machine), worst first."""
    kept, dropped = list(group), []
    while True:
        try:
            fit = fit_alpha_beta([s.x for s in kept], [s.time_s for s in kept], group[0].unit)
        except CalibrationError:
            fit = None
        errors = [(fit.time_s(s.x) - s.time_s) / s.time_s if fit else -1.0 for s in kept]
        worst = min(range(len(kept)), key=errors.__getitem__)
        if (fit is not None and errors[worst] > -0.5) or len(kept) <= 2:
            break
        dropped.append(kept.pop(worst))
    if fit is None:  # two samples left, still disturbed: the fastest one's rate, no alpha
        fit = AlphaBeta(0.0, max(s.x / s.time_s for s in kept), group[0].unit)
    return fit, dropped


# -- measurements ------------------------------------------------------------------


def _best_time_s(fn: Callable[[], object], opts: CalibrationOptions) -> float:
    fn()  # warm up (BLAS threads, page faults)
    best, start, runs = math.inf, time.perf_counter(), 0
    while runs < opts.repeats or (time.perf_counter() - start < opts.budget_s and runs < 100):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        runs += 1
    return best


def _matmuls(backend: str, dtype: str, opts: CalibrationOptions, torch) -> list[Sample]:
    out = []
    rng = np.random.default_rng(0)
    threads = torch.get_num_threads() if backend == "torch" else 0
    try:
        if threads and opts.torch_threads:
            torch.set_num_threads(opts.torch_threads)
        for n in opts.matmul_sizes:
            a = rng.standard_normal((n, n)).astype(dtype)
            b = rng.standard_normal((n, n)).astype(dtype)
            if backend == "torch":
                a, b = torch.from_numpy(a), torch.from_numpy(b)
            t = _best_time_s(lambda a=a, b=b: a @ b, opts)
            out.append(Sample("matmul", backend, dtype, 2.0 * n**3, "flops", t))
    finally:
        if threads:
            torch.set_num_threads(threads)
    return out


def _vector_adds(dtype: str, opts: CalibrationOptions) -> list[Sample]:
    out = []
    for n in opts.vector_elements:
        x, y, z = (np.ones(n, dtype=dtype) for _ in range(3))
        t = _best_time_s(lambda x=x, y=y, z=z: np.add(x, y, out=z), opts)
        out.append(Sample("vector", "numpy", dtype, float(n), "flops", t))
    return out


def _copies(opts: CalibrationOptions) -> list[Sample]:
    out = []
    for size in opts.copy_bytes:
        src, dst = np.ones(size, dtype=np.uint8), np.zeros(size, dtype=np.uint8)
        t = _best_time_s(lambda src=src, dst=dst: np.copyto(dst, src), opts)
        out.append(Sample("copy", "numpy", "uint8", 2.0 * size, "bytes", t))  # read + write
    return out


def _gloo(opts: CalibrationOptions) -> list[Sample]:
    """Two gloo ranks in child processes, joined through a TCPStore this process serves
    on 127.0.0.1 and an OS-chosen port, their connections on loopback too
    (``ir.loopback``); both are killed if they fail or outlast ``opts.timeout_s``."""
    world = Rendezvous(2, opts.timeout_s)
    world.serve()
    worker = Path(__file__).with_name("_gloo_worker.py")
    sizes = ",".join(str(s) for s in opts.message_bytes)
    args = [str(world.port), "", sizes, str(opts.repeats), str(opts.timeout_s)]
    env = {**os.environ, **loopback_environment()}
    procs: list[subprocess.Popen] = []
    deadline = time.monotonic() + opts.timeout_s
    try:
        for rank in (0, 1):
            args[1] = str(rank)
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(worker), *args],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=env,
                )
            )
        outputs = []
        for p in procs:
            while True:  # in short waits, so that a dashboard's Cancel is heard
                check()
                try:
                    outputs.append(p.communicate(timeout=0.2))
                    break
                except subprocess.TimeoutExpired:
                    if time.monotonic() < deadline:
                        continue
                    raise CalibrationError(
                        f"the gloo benchmark did not finish within {opts.timeout_s} s; its "
                        "processes were killed (a busy machine: raise "
                        "CalibrationOptions.timeout_s)"
                    ) from None
        for p, (_, err) in zip(procs, outputs):
            if p.returncode != 0:
                raise CalibrationError(
                    f"a gloo benchmark process failed (exit {p.returncode}):\n{err.strip()[-2000:]}"
                )
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        world.close()
    result = json.loads(outputs[0][0].strip().splitlines()[-1])
    return [
        Sample(kind, "gloo", "float32", float(size), "bytes", float(t))
        for kind in ("send", "allreduce")
        for size, t in result[kind]
    ]


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _memory_bytes() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16 * GB
