"""Execution backends beyond the numpy reference executor.

``ir.backends.torch_dist.run(function, inputs)`` runs a distributed program on one
real torch.distributed process per device (import torch only when used);
``torch_dist.measure(function, inputs, steps=5, warmup=2)`` times every op on every
rank and returns a :class:`~ir.backends.measurement.Measurement`, shaped like a SimResult;
``torch_dist.run_ranked(ranked, inputs, steps=1, carry=None)`` runs the per-rank programs
of ``ir.sharding.lower_to_ranks`` with torch kernels (``torch_kernels``), one process per
rank holding only its rank class's program (``torch_ranked``); ``torch_dist.measure(ranked,
inputs, steps=5, carry=...)`` times every op of each rank's own program over carried
steps and tracks each rank's live bytes (``ranked_measure``). Both take ``device="cuda"``
to put each rank on its own GPU and talk through NCCL (``torch_devices``).
"""
