#!/usr/bin/env bash
# The GPU checks in one command, run from the repository root on a machine with a GPU:
# what the machine is, the CUDA tests (tests/backends/test_torch_cuda.py), then the
# accuracy benchmark (benchmarks/bench_accuracy_gpu.py; docs/accuracy.md, "On a GPU").
#
#     OUT=/some/folder bash scripts/gpu_check.sh [bench_accuracy_gpu.py options]
#
# Writes $OUT/log.txt (everything) and $OUT/accuracy_gpu.txt (the benchmark's figures);
# OUT defaults to /tmp/gpu_check. Each part has a time limit: about 7 minutes in all.
set -u
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export OUT PYTHONPATH=. PYTHONUNBUFFERED=1
# torch.cuda.is_available() then asks NVML, not the CUDA driver: a parent that has
# initialised CUDA cannot fork ranks that use it (ir/backends/torch_devices.py)
export PYTORCH_NVML_BASED_CUDA_CHECK=1
{
    date
    nvidia-smi || echo "nvidia-smi: not found"
    python3 -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, \
'GPUs', torch.cuda.device_count(), torch.cuda.get_device_name(0) if torch.cuda.device_count() else '')"
    python3 -c "import ir, ml_dtypes, numpy; print('ir imports; numpy', numpy.__version__, \
'ml_dtypes', ml_dtypes.__version__)"
    if python3 -c "import pytest" 2>/dev/null; then
        # -o addopts=: the project's addopts name nbval, which a bare image lacks
        timeout 150 python3 -m pytest -o addopts= -p no:cacheprovider -q -rs \
            tests/backends/test_torch_cuda.py
        echo "pytest exit status $?"
    else
        echo "pytest is not installed: the CUDA tests did not run"
    fi
    timeout 330 python3 benchmarks/bench_accuracy_gpu.py --budget-s 180 "$@"
    echo "benchmark exit status $?"
    date
} 2>&1 | tee "$OUT/log.txt"
