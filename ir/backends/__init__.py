"""Execution backends beyond the numpy reference executor.

``ir.backends.torch_dist.run(function, inputs)`` runs a distributed program on one
real torch.distributed process per device (import torch only when used).
"""
