"""The options the exporters may write, as each tool documents them, so that an export
is checked against the tool before it leaves the workbench (:mod:`workbench.export`).

Names and value sets are read from the tools' own sources (no code copied):

- Megatron-LM: ``megatron/training/arguments.py`` of NVIDIA/Megatron-LM (read at commit
  ``000c4ac24f61159c138b0975def722c65245983c``): ``_add_network_size_args``,
  ``_add_training_args``, ``_add_distributed_args``, ``_add_mixed_precision_args`` and the
  data and tokenizer groups (``--seq-length``, ``--vocab-size``, ``--tokenizer-type``).
- DeepSpeed: ``docs/_pages/config-json.md`` of deepspeedai/DeepSpeed (commit
  ``00376da49967bc6a15d70a550200ac67277b1fb4``): the batch size parameters, ``optimizer``,
  ``zero_optimization.stage`` (0 to 3), ``bf16`` / ``fp16``; and its AutoTP training
  tutorial for ``tensor_parallel.autotp_size``.
- torchtitan: ``torchtitan/config/job_config.py`` of pytorch/torchtitan (commit
  ``6404b932421f5ce382e7dac5ad381b2c17b1373c``): the ``[model]``, ``[optimizer]``,
  ``[training]``, ``[parallelism]`` and ``[activation_checkpoint]`` sections of its TOML
  job file.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DEEPSPEED", "MEGATRON", "TORCHTITAN"]

# option -> ("int" | "flag" | "str", allowed values or None)
MEGATRON: dict[str, tuple[str, tuple[Any, ...] | None]] = {
    # _add_network_size_args
    "--num-layers": ("int", None),
    "--hidden-size": ("int", None),
    "--ffn-hidden-size": ("int", None),
    "--num-attention-heads": ("int", None),
    "--max-position-embeddings": ("int", None),
    "--position-embedding-type": (
        "str",
        ("learned_absolute", "rope", "mrope", "relative", "none"),
    ),
    "--normalization": ("str", ("LayerNorm", "RMSNorm")),
    # data and tokenizer arguments
    "--seq-length": ("int", None),
    "--vocab-size": ("int", None),
    "--tokenizer-type": ("str", ("NullTokenizer",)),  # the one that needs no files
    # _add_training_args
    "--micro-batch-size": ("int", None),
    "--global-batch-size": ("int", None),
    "--recompute-granularity": ("str", ("full", "selective")),
    "--recompute-method": ("str", ("uniform", "block")),
    "--recompute-num-layers": ("int", None),
    "--optimizer": ("str", ("adam", "sgd", "muon", "dist_muon")),
    "--sequence-parallel": ("flag", None),
    # _add_distributed_args
    "--tensor-model-parallel-size": ("int", None),
    "--pipeline-model-parallel-size": ("int", None),
    "--num-layers-per-virtual-pipeline-stage": ("int", None),
    "--use-distributed-optimizer": ("flag", None),
    "--use-megatron-fsdp": ("flag", None),
    "--data-parallel-sharding-strategy": (
        "str",
        ("no_shard", "optim", "optim_grads", "optim_grads_params"),
    ),
    "--overlap-grad-reduce": ("flag", None),
    # _add_mixed_precision_args
    "--bf16": ("flag", None),
    "--fp16": ("flag", None),
}

# key path -> allowed type(s) and values (None: any of the type)
DEEPSPEED: dict[tuple[str, ...], tuple[type | tuple[type, ...], tuple[Any, ...] | None]] = {
    ("train_batch_size",): (int, None),
    ("train_micro_batch_size_per_gpu",): (int, None),
    ("gradient_accumulation_steps",): (int, None),
    ("optimizer", "type"): (str, ("Adam", "AdamW", "Lamb", "Muon", "SGD")),
    ("optimizer", "params", "lr"): ((int, float), None),
    ("zero_optimization", "stage"): (int, (0, 1, 2, 3)),
    ("bf16", "enabled"): (bool, None),
    ("fp16", "enabled"): (bool, None),
    ("tensor_parallel", "autotp_size"): (int, None),
}

# section -> key -> (type(s), allowed values or None)
TORCHTITAN: dict[str, dict[str, tuple[type | tuple[type, ...], tuple[Any, ...] | None]]] = {
    "job": {"description": (str, None)},
    "model": {"name": (str, None), "flavor": (str, None)},
    "optimizer": {"name": (str, ("Adam", "AdamW")), "lr": ((int, float), None)},
    "training": {
        "local_batch_size": (int, None),
        "global_batch_size": (int, None),
        "seq_len": (int, None),
        "steps": (int, None),
        "mixed_precision_param": (str, ("bfloat16", "float32")),
    },
    "parallelism": {
        "data_parallel_replicate_degree": (int, None),
        "data_parallel_shard_degree": (int, None),
        "tensor_parallel_degree": (int, None),
        "pipeline_parallel_degree": (int, None),
        # torch.distributed.pipelining's schedule names
        "pipeline_parallel_schedule": (str, ("1F1B", "GPipe", "Interleaved1F1B")),
        "pipeline_parallel_microbatch_size": (int, None),
        "pipeline_parallel_layers_per_stage": (int, None),
    },
    "activation_checkpoint": {"mode": (str, ("selective", "full", "none"))},
}
