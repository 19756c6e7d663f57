"""Where the ranked runner's workers compute: the CPU (gloo) or one CUDA GPU per rank (NCCL).

``device="cpu"`` (the default): every rank is a process on the CPU, and ranks talk
through gloo. ``device="cuda"``: rank ``i`` of the world (its position in
``ranked.ranks``) computes on GPU ``i % torch.cuda.device_count()``, its arguments and
every value it makes live there, and ranks talk through NCCL. NCCL refuses two ranks
on one GPU, so a program with more ranks than the machine has GPUs is refused before
any process starts (:func:`check_device`), as is ``"cuda"`` on a machine without one.

The workers are forked from the caller, and CUDA cannot run in a child forked from a
process that has initialised it. ``torch.cuda.is_available()`` initialises the CUDA
driver (``cudaGetDeviceCount`` calls ``cuInit``) unless ``PYTORCH_NVML_BASED_CUDA_CHECK=1``
is set, so the parent counts GPUs with ``torch.cuda.device_count()``, which asks NVML
first and initialises nothing when NVML answers; a caller that has used CUDA itself
is refused with what to do instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .torch_dist import BackendError

__all__ = ["DEVICES", "check_device", "to_numpy", "to_torch", "worker_device"]

DEVICES = ("cpu", "cuda")


def check_device(device: Any, world_size: int) -> None:
    """Refuse, before any process starts, a ``device`` this machine cannot give
    ``world_size`` ranks (module doc); ``"cpu"`` always passes."""
    if device == "cpu":
        return
    if device != "cuda":
        raise BackendError(f"device must be one of {DEVICES}, got {device!r}")
    import torch

    if torch.cuda.is_initialized():
        raise BackendError(
            "device='cuda': this process has initialised CUDA already, and the ranks are "
            "processes forked from it, where CUDA cannot start again; measure or run in a "
            "process that has not used CUDA (check with torch.cuda.device_count(), not "
            "torch.cuda.is_available(), or set PYTORCH_NVML_BASED_CUDA_CHECK=1)"
        )
    count = torch.cuda.device_count()  # NVML first: leaves CUDA uninitialised (module doc)
    if count == 0:
        raise BackendError(
            f"device='cuda' but torch sees no CUDA GPU here (torch {torch.__version__}, "
            f"CUDA build {torch.version.cuda}; torch.cuda.device_count() is 0): run with "
            "device='cpu' (the default), or on a machine with an NVIDIA GPU and a CUDA "
            "build of torch"
        )
    if world_size > count:
        raise BackendError(
            f"device='cuda' puts each rank on its own GPU (NCCL cannot run two ranks on one "
            f"GPU), but the program has {world_size} ranks and this machine {count} GPU"
            f"{'s' if count > 1 else ''}: lower a program with at most {count} ranks, run "
            "on more GPUs, or use device='cpu'"
        )


def worker_device(device: str, position: int) -> Any:
    """In a worker: the ``torch.device`` rank ``position`` computes on (made current), or
    ``None`` on the CPU."""
    if device == "cpu":
        return None
    import torch

    index = position % torch.cuda.device_count()
    try:
        torch.cuda.set_device(index)  # CUDA starts here, in the forked worker
    except RuntimeError as e:
        raise BackendError(
            f"CUDA did not start on GPU {index} in this rank's process ({e}); the process is "
            "forked from the caller, which has most likely initialised the CUDA driver "
            "(torch.cuda.is_available() does unless PYTORCH_NVML_BASED_CUDA_CHECK=1 is set): "
            "measure or run from a process that has not used CUDA"
        ) from e
    return torch.device("cuda", index)


def to_torch(array: Any, device: Any) -> Any:
    """A copy of a numpy ``array`` as a tensor on ``device`` (``None``: the CPU);
    bfloat16 (ml_dtypes, which torch cannot read) goes through its bits."""
    import torch

    a = np.array(array, copy=True)
    if a.dtype.name == "bfloat16":
        tensor = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    else:
        tensor = torch.from_numpy(a)
    return tensor if device is None else tensor.to(device)


def to_numpy(x: Any) -> Any:
    """A worker's value as the parent takes it: a tensor as a numpy array on the host
    (bfloat16 as ml_dtypes' bfloat16), a tuple element by element; anything else as is."""
    if isinstance(x, tuple):
        return tuple(to_numpy(e) for e in x)
    if not hasattr(x, "numpy"):
        return x
    import torch

    x = x.detach().cpu()
    if x.dtype == torch.bfloat16:
        import ml_dtypes

        return x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return x.numpy()
