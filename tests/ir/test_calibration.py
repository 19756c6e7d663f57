"""ir.calibrate: the alpha-beta fit, the topology it builds, and a real (quick) run."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

import ir
from ir import FunctionBuilder, TensorType
from ir.calibration import (
    AlphaBeta,
    CalibrationError,
    CalibrationOptions,
    Sample,
    _fitted,
    fit_alpha_beta,
)


@pytest.mark.parametrize(
    ("alpha_s", "rate_per_s", "xs"),
    [
        (2e-6, 12e9, [4e3, 6.4e4, 1e6, 1.6e7]),  # a link: latency and bandwidth
        (0.0, 1.5e11, [5e5, 4e6, 3.4e7]),  # matmul flops, no overhead
        (3e-4, 1.2e9, [1.0, 2.0]),  # two samples determine the line
    ],
)
def test_the_fit_recovers_known_alpha_and_beta(alpha_s, rate_per_s, xs):
    times = [alpha_s + x / rate_per_s for x in xs]
    fit = fit_alpha_beta(xs, times)
    assert fit.alpha_s == pytest.approx(alpha_s, rel=1e-9, abs=1e-15)
    assert fit.rate_per_s == pytest.approx(rate_per_s, rel=1e-9)
    assert [fit.time_s(x) for x in xs] == pytest.approx(times, rel=1e-9)


def test_a_fit_needs_two_sizes_and_growing_times():
    with pytest.raises(CalibrationError, match="two or more distinct sizes"):
        fit_alpha_beta([1e6, 1e6], [1e-3, 1e-3])
    with pytest.raises(CalibrationError, match="do not grow with size"):
        fit_alpha_beta([1e3, 1e6], [2e-3, 1e-3])


def synthetic_samples(disturbed: bool = False) -> list[Sample]:
    def series(kind, backend, dtype, unit, ab: AlphaBeta, xs):
        return [Sample(kind, backend, dtype, x, unit, ab.time_s(x)) for x in xs]

    samples = [
        *series("matmul", "numpy", "float32", "flops", AlphaBeta(5e-6, 2e11), [5e5, 4e6, 3e7, 2e8]),
        *series("matmul", "numpy", "float64", "flops", AlphaBeta(5e-6, 1e11), [5e5, 4e6, 3e7]),
        *series("vector", "numpy", "float32", "flops", AlphaBeta(5e-7, 7e9), [4e3, 1.6e4, 6.4e4]),
        *series("vector", "numpy", "float64", "flops", AlphaBeta(5e-7, 3e9), [4e3, 1.6e4, 6.4e4]),
        *series("copy", "numpy", "uint8", "bytes", AlphaBeta(0.0, 1e10), [1.3e8, 2.7e8, 5.4e8]),
        *series("send", "gloo", "float32", "bytes", AlphaBeta(1e-4, 4e9), [4e3, 6.6e4, 1e6, 4e6]),
        *series("allreduce", "gloo", "float32", "bytes", AlphaBeta(3e-4, 2e9), [4e3, 1e6, 4e6]),
    ]
    if disturbed:  # a matmul that waited a scheduler quantum for a descheduled thread
        samples[1] = Sample("matmul", "numpy", "float32", 4e6, "flops", 12e-3)
    return samples


def test_a_calibration_builds_a_topology_from_its_fits():
    c = _fitted(synthetic_samples())
    assert c.residuals == pytest.approx([0.0] * len(c.samples), abs=1e-9)
    assert c.matrix_peak_flops == pytest.approx({"float32": 2e11, "float64": 1e11})
    t = c.topology(2)
    d = t.devices[0]
    assert d.device_type == "cpu" and d.peak_flops == pytest.approx(2e11)
    assert d.peak_flops_for("float64", matrix=True) == pytest.approx(1e11)
    assert d.peak_flops_for("float32", matrix=False) == pytest.approx(7e9)
    assert d.mem_bandwidth_bytes_per_s == pytest.approx(1e10)
    assert d.launch_overhead_s == pytest.approx(5e-7)
    assert t.bandwidth(0, 1) == pytest.approx(4e9) and t.latency(0, 1) == pytest.approx(1e-4)
    assert "matmul/numpy/float32" in c.summary_markdown()


def test_a_disturbed_sample_is_left_out_of_the_fit_and_said_so():
    c = _fitted(synthetic_samples(disturbed=True))
    fit = c.fits["matmul/numpy/float32"]
    assert fit.rate_per_s == pytest.approx(2e11) and fit.alpha_s == pytest.approx(5e-6)
    assert c.residuals[1] < -0.9  # reported, not hidden
    assert any("matmul/numpy/float32" in note and "4e+06" in note for note in c.notes)


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def test_a_quick_real_calibration_measures_this_machine_and_gloo_links():
    pytest.importorskip("torch.distributed", reason="torch is needed for the gloo processes")
    before = _children(os.getpid())
    c = ir.calibrate(quick=True, progress=False)
    kinds = {s.kind for s in c.samples}
    assert kinds == {"matmul", "vector", "copy", "send", "allreduce"}
    assert {s.backend for s in c.samples if s.kind == "matmul"} == {"numpy", "torch"}
    assert len(c.residuals) == len(c.samples)
    assert all(math.isfinite(r) for r in c.residuals)
    for fit in c.fits.values():
        assert math.isfinite(fit.rate_per_s) and fit.rate_per_s > 0
    assert c.link is not None and c.link.rate_per_s > 1e6  # loopback moves MB/s at least
    topology = c.topology(2)
    b = FunctionBuilder("mm")
    x = b.input("x", TensorType((256, 256), device=0))
    y = b.call("MatMul", x, x)
    moved = b.call("Send", y, to_device=1)
    result = ir.simulate(b.finish([moved]), topology)
    assert 0 < result.step_time_s < math.inf
    assert _children(os.getpid()) == before  # the gloo ranks are gone


def test_gloo_processes_that_outlast_the_timeout_are_killed():
    pytest.importorskip("torch.distributed", reason="torch is needed for the gloo processes")
    before = _children(os.getpid())
    opts = CalibrationOptions(
        matmul_sizes=(32, 64),
        vector_elements=(256, 512),
        copy_bytes=(2**16, 2**17),
        message_bytes=(2**10, 2**11),
        budget_s=0.0,
        repeats=1,
        use_torch=False,
        timeout_s=0.2,  # too short to even import torch in the children
    )
    with pytest.raises(CalibrationError, match=r"did not finish within 0\.2 s"):
        ir.calibrate(opts, progress=False)
    assert _children(os.getpid()) == before
