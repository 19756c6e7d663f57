"""The ranked runner and its measurement on CUDA (device="cuda": each rank on its own GPU,
NCCL): refused clearly where the machine cannot, and, on a GPU, a one-rank training step
equal to the numpy executor over carried steps, half precision included, and every op
timed.

The GPU tests skip without a GPU; scripts/gpu_check.sh runs them on one. The skip asks
torch.cuda.device_count(), never torch.cuda.is_available(): the latter initialises the
CUDA driver in this (the parent) process, and the ranks are forked from it.
"""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir import transforms
from ir.sharding import lower_to_ranks

pytest.importorskip("torch.distributed", reason="torch is not installed (pip install torch)")

import torch

from ir.backends import torch_dist, torch_kernels, torch_ranked
from ir.backends.torch_devices import to_numpy, to_torch
from ir.backends.torch_ranked import carry_of

GPUS = torch.cuda.device_count()  # NVML: leaves CUDA uninitialised here
needs_gpu = pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU (torch sees none)")
# what runs on the GPU runs on the CPU too (there, the test checks itself and gloo)
DEVICES = ["cpu", pytest.param("cuda", marks=needs_gpu)]
F64 = ir.DType.float64


def _one_rank(f: ir.Function, seed: int = 0):
    """The one-device step of ``f``, lowered to its one rank, and its inputs."""
    g = transforms.megatron(f, 1, 1, 1, 1)
    inputs = ir.distribute(g, ir.random_inputs(f, seed=seed), source=f)
    return g, lower_to_ranks(g), inputs


def _flat(values) -> list:
    out = []
    for v in values:
        out += _flat(v) if isinstance(v, tuple | list) else [v]
    return out


def _no_launch(*args, **kwargs):
    raise AssertionError("a worker process was started")


@pytest.mark.skipif(GPUS > 0, reason="this machine has a CUDA GPU")
def test_cuda_without_a_gpu_is_refused_before_any_process_starts(monkeypatch):
    f = ir.models.mlp(8, 4, 6, 4, layers=2, training=True, dtype=F64)
    _, ranked, inputs = _one_rank(f)
    monkeypatch.setattr(torch_ranked, "launch", _no_launch)
    for call in (torch_dist.run_ranked, torch_dist.measure):
        with pytest.raises(torch_dist.BackendError, match=r"no CUDA GPU.*device='cpu'"):
            call(ranked, inputs, device="cuda")


def test_a_device_that_is_neither_cpu_nor_cuda_is_refused(monkeypatch):
    f = ir.models.mlp(8, 4, 6, 4, layers=2, training=True, dtype=F64)
    _, ranked, inputs = _one_rank(f)
    monkeypatch.setattr(torch_ranked, "launch", _no_launch)
    with pytest.raises(torch_dist.BackendError, match=r"device must be one of \('cpu', 'cuda'\)"):
        torch_dist.run_ranked(ranked, inputs, device="gpu")


def test_more_ranks_than_gpus_is_refused_naming_both_counts(monkeypatch):
    # NCCL cannot put two ranks on one GPU: a run would hang or fail inside the workers
    f = ir.models.mlp(8, 4, 6, 4, layers=2, training=True, dtype=F64)
    g = transforms.data_parallel(f, 2)
    inputs = ir.distribute(g, ir.random_inputs(f, seed=0), source=f)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch_ranked, "launch", _no_launch)
    with pytest.raises(torch_dist.BackendError, match="2 ranks and this machine 1 GPU:"):
        torch_dist.measure(lower_to_ranks(g), inputs, device="cuda")


def test_a_global_program_is_measured_on_the_cpu_only():
    f = ir.models.mlp(8, 4, 6, 4, layers=2, dtype=F64)
    with pytest.raises(torch_dist.BackendError, match="needs a ranked program"):
        torch_dist.measure(f, ir.random_inputs(f), device="cuda")


def test_bfloat16_arrays_cross_to_torch_and_back_bit_for_bit():
    import ml_dtypes

    a = (np.arange(12, dtype=np.float32).reshape(3, 4) / 7).astype(ml_dtypes.bfloat16)
    t = to_torch(a, None)
    assert t.dtype == torch.bfloat16 and t.shape == (3, 4)
    np.testing.assert_array_equal(t.float().numpy(), a.astype(np.float32))
    back = to_numpy((t, t * 2))
    assert back[0].dtype == a.dtype
    assert back[0].tobytes() == a.tobytes()


def test_a_half_precision_loss_over_many_tokens_stays_finite():
    # 16k tokens at a loss near log(50): numpy's float16 total would be inf
    rng = np.random.default_rng(0)
    y = torch.from_numpy(rng.standard_normal((16, 1024, 50)).astype(np.float16))
    z = torch.from_numpy(rng.integers(0, 50, (16, 1024)))
    attrs = {"kind": "cross_entropy", "denominator": 0}
    (half,) = torch_kernels.TORCH_KERNELS["Loss"]([y, z], attrs)
    (wide,) = torch_kernels.TORCH_KERNELS["Loss"]([y.float(), z], attrs)
    assert torch.isfinite(half)
    assert float(half) == pytest.approx(float(wide), rel=1e-3)


def test_a_bfloat16_gpt_step_runs_on_cpu_ranks_like_numpy():
    f = ir.models.gpt(2, 4, 8, 2, 11, 1, training=True, dtype=ir.DType.bfloat16)
    _, ranked, inputs = _one_rank(f)
    got = torch_dist.run_ranked(ranked, inputs)
    want = ir.sharding.run_ranked(ranked, inputs)
    for i, (x, y) in enumerate(zip(_flat(got), _flat(want))):
        assert x.dtype.name == "bfloat16"  # every output of this step is declared bfloat16
        np.testing.assert_allclose(x.astype(np.float32), y.astype(np.float32), 0.1, 0.1, str(i))


def _sequential_steps(f: ir.Function, inputs: list, steps: int) -> tuple:
    """``steps`` steps of the sequential program ``f``, its state carried, on numpy."""
    carry = carry_of(f)
    names = [v.name for v in f.inputs]
    for _ in range(steps):
        outputs = ir.execute(f, inputs)
        inputs = list(inputs)
        for index, name in carry.items():
            inputs[names.index(name)] = outputs[index]
    return outputs


GPU_STEPS = {
    "mlp sgd": lambda: ir.models.mlp(8, 4, 6, 4, layers=2, training=True, dtype=F64),
    "gpt adam": lambda: transforms.training(ir.models.gpt(2, 8, 16, 2, 13, 2, dtype=F64), "adam"),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(GPU_STEPS))
def test_a_one_rank_training_step_equals_numpy_over_carried_steps(name, device):
    f = GPU_STEPS[name]()
    seq = ir.random_inputs(f, seed=3)
    g, ranked, inputs = _one_rank(f, seed=3)
    got = torch_dist.run_ranked(ranked, inputs, steps=2, carry=carry_of(f), device=device)
    want = _sequential_steps(f, seq, 2)
    for i, (whole, expected) in enumerate(zip(ir.collect(g, list(got)), want)):
        assert isinstance(whole, np.ndarray) and whole.dtype == expected.dtype
        np.testing.assert_allclose(whole, expected, rtol=1e-7, atol=1e-10, err_msg=f"out {i}")
    once = _sequential_steps(f, seq, 1)
    assert not np.allclose(once[0], want[0])  # the second step really moved on
    assert not torch.cuda.is_initialized()  # the parent never touched CUDA: forks stay safe


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_half_precision_gpt_step_runs_with_a_finite_loss(dtype, device):
    f = transforms.training(ir.models.gpt(4, 64, 64, 4, 97, 2, dtype=dtype), "adam")
    g, ranked, inputs = _one_rank(f)
    got = torch_dist.run_ranked(ranked, inputs, steps=2, carry=carry_of(f), device=device)
    loss = ir.collect(g, list(got))[-1]
    with np.errstate(over="ignore"):  # numpy's float16 LayerNorm squares overflow; torch's too
        want = ir.execute(f, ir.random_inputs(f, seed=0))[-1]
    assert loss.dtype == want.dtype and np.isfinite(loss.astype(np.float32))
    assert 0 < float(loss) < 2 * float(want)  # one Adam step on: a loss of the same order


@pytest.mark.parametrize("device", DEVICES)
def test_measure_times_every_op_of_the_rank_program(device):
    from ir.registry import OpKind, get_op

    f = GPU_STEPS["gpt adam"]()
    _, ranked, inputs = _one_rank(f)
    m = torch_dist.measure(ranked, inputs, steps=2, warmup=1, carry=carry_of(f), device=device)
    program = m.programs[ranked.ranks[0]]
    timed = [op for op in program.ops if get_op(op.op_type).kind is not OpKind.CONTROL]
    assert m.steps == 2 and m.step_time_s > 0
    for events in m.step_events:
        assert sorted(id(e.op) for e in events) == sorted(id(op) for op in timed)
        assert all(e.end_s >= e.start_s >= 0 for e in events)
    rank = ranked.ranks[0]
    assert m.peak_memory_bytes[rank] > sum(v.type.size_bytes for v in program.inputs)
    if device == "cuda":  # the allocator holds at least the live tensors (and temporaries)
        assert m.allocated_peak_bytes[rank] >= 0.9 * m.peak_memory_bytes[rank]
    else:
        assert m.allocated_peak_bytes == {}
    assert not torch.cuda.is_initialized()


def test_an_allocator_peak_in_a_rank_record_is_kept_per_step():
    from ir.backends.measurement import Measurement

    f = ir.models.mlp(4, 3, 5, 2)
    relu = next(i for i, op in enumerate(f.ops) if op.op_type == "Relu")
    steps = [(1.0, [(relu, 1.0, 1.5)], [(1.0, 10.0)], 64.0), (2.0, [(relu, 2.0, 2.1)], [], 96.0)]
    m = Measurement.from_rank_records({0: f}, {0: steps})
    assert m.step_allocated_peak == ({0: 64.0}, {0: 96.0})
    assert m.allocated_peak_bytes == {0: 64.0 if m.median_step == 0 else 96.0}
    without = Measurement.from_rank_records({0: f}, {0: [s[:3] for s in steps]})
    assert without.allocated_peak_bytes == {} and without.step_allocated_peak == ()


@needs_gpu
def test_more_ranks_than_this_machines_gpus_are_refused():
    f = ir.models.mlp(8, 4, 6, 4, layers=2, training=True, dtype=F64)
    g = transforms.data_parallel(f, GPUS + 1)
    inputs = ir.distribute(g, ir.random_inputs(f, seed=0), source=f)
    with pytest.raises(torch_dist.BackendError, match="NCCL cannot run two ranks on one GPU"):
        torch_dist.run_ranked(lower_to_ranks(g), inputs, device="cuda")
