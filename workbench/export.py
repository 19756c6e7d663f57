"""Strategies that leave the workbench: the chosen strategy as Megatron-LM command-line
arguments, a DeepSpeed JSON config and a torchtitan TOML job file.

Each export is checked against the options its tool documents
(:mod:`workbench.export_options`, with the sources cited) before it is returned: an
option or a value the tool does not have is a :class:`ExportError`, not a file that
fails on the cluster. What a tool cannot express of the strategy (GPipe in Megatron-LM,
ZeRO-1 in torchtitan, ...) is said in the export's ``notes``, never dropped silently.

>>> from workbench.example import example_model
>>> plan = Plan(dp=2, tp=2, pp=2, microbatches=4)
>>> export = megatron_args(plan, gpt_shape(example_model()))
>>> export.text.split()[:4]
['torchrun', '--nproc_per_node', '8', 'pretrain_gpt.py']
>>> "--tensor-model-parallel-size 2" in export.text
True
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from ir.errors import DistIRError
from ir.function import Function
from ir.types import TensorType

from .export_options import DEEPSPEED, MEGATRON, TORCHTITAN

__all__ = [
    "TOOLS",
    "Export",
    "ExportError",
    "GptShape",
    "Plan",
    "deepspeed_config",
    "export",
    "gpt_shape",
    "megatron_args",
    "torchtitan_toml",
]

TOOLS = ("megatron", "deepspeed", "torchtitan")


class ExportError(DistIRError):
    """A strategy or model that cannot be exported as asked; the message says why."""


@dataclass(frozen=True)
class Plan:
    """What an export describes: the strategy's degrees and options (the workbench's
    ready transforms, or a search row's ``ir.search.Strategy``), its optimizer and the
    dtype its matmuls run in."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    microbatches: int = 1
    schedule: str = "1f1b"
    chunks: int = 1
    zero: int = 0
    sequence_parallel: bool = False
    recompute: bool = False
    optimizer: str = "adam"
    dtype: str = "float32"

    @property
    def devices(self) -> int:
        return self.dp * self.tp * self.pp

    @classmethod
    def of(cls, strategy: Any, **rest: Any) -> Plan:
        """The plan of a workbench ``Strategy`` (``hp`` its tensor degree) or of an
        ``ir.search.Strategy`` (``tp``). Expert and context parallelism are not exported
        yet: a strategy with ``ep`` or ``cp`` above 1 is an ExportError, not a file that
        silently leaves them out."""
        for name in ("ep", "cp"):
            degree = getattr(strategy, name, 1)
            if degree > 1:
                raise ExportError(
                    f"{name}={degree}: expert and context parallelism are not exported yet "
                    "(the file would leave them out); export the strategy without them and "
                    "add the tool's option by hand"
                )
        tp = getattr(strategy, "tp", None) or getattr(strategy, "hp", 1)
        fields = {
            name: getattr(strategy, name)
            for name in ("microbatches", "schedule", "chunks", "zero", "sequence_parallel")
            if hasattr(strategy, name)
        }
        if getattr(strategy, "recompute", False):
            fields["recompute"] = True
        return cls(dp=strategy.dp, tp=tp, pp=strategy.pp, **fields, **rest)


@dataclass(frozen=True)
class GptShape:
    """The sizes a training framework needs of a GPT (``ir.models.gpt``'s names)."""

    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    batch: int


@dataclass(frozen=True)
class Export:
    """One tool's export: its ``text`` (a command line, JSON or TOML), the ``data`` it
    was written from, what the tool cannot express (``notes``) and a file name."""

    tool: str
    text: str
    data: Any
    filename: str
    notes: tuple[str, ...] = field(default=())


def gpt_shape(function: Function) -> GptShape:
    """The sizes of a GPT built by ``ir.models.gpt`` (or its training step), read from its
    weights (``wte``, ``wpe``, ``h{i}_...``) and its heads reshape; an ExportError for any
    other program."""
    inputs = {v.name: v.type for v in function.inputs}
    missing = [n for n in ("wte", "wpe", "tokens") if n not in inputs]
    if missing:
        raise ExportError(
            f"{function.name!r} is not a GPT of ir.models.gpt (no input {missing[0]!r}): the "
            "exporters write Megatron-LM, DeepSpeed and torchtitan configs for that model"
        )
    wte, wpe, tokens = inputs["wte"], inputs["wpe"], inputs["tokens"]
    assert isinstance(wte, TensorType) and isinstance(wpe, TensorType)
    assert isinstance(tokens, TensorType)
    layers = len({m.group(1) for n in inputs if (m := re.match(r"h(\d+)_ln1_g$", n))})
    heads = next(
        (
            op.attributes["shape"][2]
            for op in function.ops
            if op.op_type == "Reshape" and op.outputs[0].name == "h0_q_r"
        ),
        None,
    )
    if heads is None or not layers:
        raise ExportError(f"{function.name!r}: cannot read its layers and heads as a GPT's")
    return GptShape(
        layers=layers,
        hidden=wte.shape[1],
        heads=int(heads),
        seq=wpe.shape[0],
        vocab=wte.shape[0],
        batch=tokens.shape[0],
    )


def _micro_batch(plan: Plan, shape: GptShape) -> int:
    per_replica, left = divmod(shape.batch, plan.dp)
    micro, left2 = divmod(per_replica, plan.microbatches)
    if left or left2 or micro < 1:
        raise ExportError(
            f"a batch of {shape.batch} does not split into dp={plan.dp} replicas of "
            f"{plan.microbatches} equal microbatches: choose degrees that divide it"
        )
    return micro


def _check_degrees(plan: Plan, shape: GptShape) -> None:
    if shape.heads % plan.tp or shape.hidden % plan.tp:
        raise ExportError(
            f"tp={plan.tp} does not divide the {shape.heads} heads and hidden size "
            f"{shape.hidden}: tensor parallelism splits both"
        )
    if shape.layers % (plan.pp * plan.chunks):
        raise ExportError(
            f"pp={plan.pp} x chunks={plan.chunks} does not divide the {shape.layers} layers"
        )


def megatron_args(plan: Plan, shape: GptShape, script: str = "pretrain_gpt.py") -> Export:
    """The ``torchrun`` command line that trains ``shape`` with ``plan`` in Megatron-LM
    (data parallelism is what is left of the world size: ``dp = world / (tp * pp)``)."""
    _check_degrees(plan, shape)
    micro = _micro_batch(plan, shape)
    notes = []
    args: list[tuple[str, Any]] = [
        ("--num-layers", shape.layers),
        ("--hidden-size", shape.hidden),
        ("--ffn-hidden-size", 4 * shape.hidden),
        ("--num-attention-heads", shape.heads),
        ("--seq-length", shape.seq),
        ("--max-position-embeddings", shape.seq),
        ("--position-embedding-type", "learned_absolute"),
        ("--normalization", "LayerNorm"),
        ("--tokenizer-type", "NullTokenizer"),
        ("--vocab-size", shape.vocab),
        ("--micro-batch-size", micro),
        ("--global-batch-size", shape.batch),
        ("--tensor-model-parallel-size", plan.tp),
        ("--pipeline-model-parallel-size", plan.pp),
        ("--optimizer", plan.optimizer),
    ]
    if plan.chunks > 1:
        args.append(
            ("--num-layers-per-virtual-pipeline-stage", shape.layers // (plan.pp * plan.chunks))
        )
    if plan.sequence_parallel:
        args.append(("--sequence-parallel", True))
    if plan.zero in (1, 2):
        args.append(("--use-distributed-optimizer", True))
        if plan.zero == 2:
            notes.append(
                "ZeRO-2: Megatron-LM's distributed optimizer shards the optimizer state and "
                "reduce-scatters the gradients; there is no separate stage 2 switch"
            )
    elif plan.zero == 3:
        args += [("--use-megatron-fsdp", True)]
        args += [("--data-parallel-sharding-strategy", "optim_grads_params")]
    if plan.recompute:
        args.append(("--recompute-granularity", "full"))
        args += [("--recompute-method", "uniform"), ("--recompute-num-layers", 1)]
    if plan.dtype in ("bfloat16", "float16"):
        args.append(("--bf16" if plan.dtype == "bfloat16" else "--fp16", True))
    if plan.pp > 1 and plan.schedule == "gpipe":
        notes.append(
            "Megatron-LM runs pipelines 1F1B (no GPipe schedule): same bubble, less memory"
        )
    if plan.pp > 1 and plan.microbatches < plan.pp:
        notes.append(
            f"{plan.microbatches} microbatches for {plan.pp} stages: Megatron-LM asks for at "
            "least as many microbatches as stages"
        )
    _check_megatron(args)
    launch = f"torchrun --nproc_per_node {min(plan.devices, 8)}"
    if plan.devices > 8:  # 8 GPUs a node
        launch += f" --nnodes {math.ceil(plan.devices / 8)}"
    lines = [f"{launch} {script}"]
    lines += [option if value is True else f"{option} {value}" for option, value in args]
    text = " \\\n    ".join(lines) + "\n"
    return Export("megatron", text, dict(args), "megatron_args.sh", tuple(notes))


def _check_megatron(args: list[tuple[str, Any]]) -> None:
    for option, value in args:
        if option not in MEGATRON:
            raise ExportError(
                f"Megatron-LM has no option {option} (megatron/training/arguments.py)"
            )
        kind, allowed = MEGATRON[option]
        ok = (
            (kind == "flag" and value is True)
            or (
                kind == "int"
                and isinstance(value, int)
                and not isinstance(value, bool)
                and value > 0
            )
            or (kind == "str" and isinstance(value, str))
        )
        if not ok or (allowed is not None and value not in allowed):
            raise ExportError(f"Megatron-LM's {option} does not take {value!r}")


def deepspeed_config(plan: Plan, shape: GptShape) -> Export:
    """The DeepSpeed JSON config of ``plan``: batch sizes (``train_batch_size`` =
    micro-batch x gradient accumulation x data-parallel GPUs), optimizer, ZeRO stage,
    precision and AutoTP's tensor degree. Pipeline stages are set in code
    (``PipelineModule(num_stages=pp)``): said in the notes."""
    _check_degrees(plan, shape)
    micro = _micro_batch(plan, shape)
    notes = []
    config: dict[str, Any] = {
        "train_batch_size": shape.batch,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": plan.microbatches,
        "optimizer": {
            "type": {"adam": "Adam", "sgd": "SGD"}.get(plan.optimizer, plan.optimizer),
            "params": {"lr": 1e-4},
        },
        "zero_optimization": {"stage": plan.zero},
        "bf16": {"enabled": plan.dtype == "bfloat16"},
        "fp16": {"enabled": plan.dtype == "float16"},
    }
    if plan.tp > 1:
        config["tensor_parallel"] = {"autotp_size": plan.tp}
    if plan.pp > 1:
        notes.append(
            f"pipeline: build the model as deepspeed.pipe.PipelineModule(..., num_stages={plan.pp})"
            f"; its engine runs the {plan.microbatches} microbatches (gradient_accumulation_steps) "
            "1F1B"
        )
        if plan.zero > 1:
            notes.append("DeepSpeed's pipeline engine takes ZeRO stages 0 and 1 only")
    if plan.sequence_parallel:
        notes.append("Megatron-style sequence parallelism has no DeepSpeed config key")
    if plan.recompute:
        notes.append("recomputation: deepspeed.checkpointing.checkpoint around each layer (code)")
    _check_deepspeed(config)
    text = json.dumps(config, indent=2) + "\n"
    return Export("deepspeed", text, config, "ds_config.json", tuple(notes))


def _check_deepspeed(config: dict[str, Any], path: tuple[str, ...] = ()) -> None:
    for key, value in config.items():
        here = (*path, key)
        if isinstance(value, dict):
            _check_deepspeed(value, here)
            continue
        if here not in DEEPSPEED:
            raise ExportError(f"DeepSpeed's config has no key {'.'.join(here)}")
        kinds, allowed = DEEPSPEED[here]
        if not isinstance(value, kinds) or (allowed is not None and value not in allowed):
            raise ExportError(f"DeepSpeed's {'.'.join(here)} does not take {value!r}")


def torchtitan_toml(plan: Plan, shape: GptShape, steps: int = 1000) -> Export:
    """A torchtitan job file (TOML) for ``plan``: the degrees of its ``[parallelism]``
    (data parallel as replication, or FSDP sharding for ZeRO-3), the batch and sequence
    of its ``[training]``, its optimizer and activation checkpointing."""
    _check_degrees(plan, shape)
    micro = _micro_batch(plan, shape)
    notes = [
        "torchtitan trains its own model definitions: set [model] flavor to one with "
        f"{shape.layers} layers, hidden {shape.hidden}, {shape.heads} heads, vocab "
        f"{shape.vocab} (its Llama has rotary positions and RMSNorm, this GPT learned "
        "positions and LayerNorm)"
    ]
    shard = plan.dp if plan.zero == 3 else 1
    if plan.zero in (1, 2):
        notes.append(
            f"ZeRO-{plan.zero} has no torchtitan switch: data_parallel_shard_degree shards "
            "parameters too (ZeRO-3, FSDP); replication is written"
        )
    schedule = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "Interleaved1F1B"}
    sections: dict[str, dict[str, Any]] = {
        "job": {"description": f"exported by DistIR Workbench: {plan.dp}x{plan.tp}x{plan.pp}"},
        "model": {"name": "llama3", "flavor": "debugmodel"},
        "optimizer": {"name": "AdamW" if plan.optimizer == "adam" else "Adam", "lr": 1e-4},
        "training": {
            "local_batch_size": shape.batch // plan.dp,
            "global_batch_size": shape.batch,
            "seq_len": shape.seq,
            "steps": steps,
            "mixed_precision_param": "bfloat16" if plan.dtype == "bfloat16" else "float32",
        },
        "parallelism": {
            "data_parallel_replicate_degree": plan.dp // shard,
            "data_parallel_shard_degree": shard,
            "tensor_parallel_degree": plan.tp,
            "pipeline_parallel_degree": plan.pp,
        },
        "activation_checkpoint": {"mode": "full" if plan.recompute else "none"},
    }
    if plan.optimizer == "sgd":
        notes.append("torchtitan builds Adam or AdamW only: Adam is written for SGD")
    if plan.pp > 1:
        sections["parallelism"]["pipeline_parallel_schedule"] = schedule[plan.schedule]
        sections["parallelism"]["pipeline_parallel_microbatch_size"] = micro
        if plan.chunks > 1:
            per_stage = shape.layers // (plan.pp * plan.chunks)
            sections["parallelism"]["pipeline_parallel_layers_per_stage"] = per_stage
    if plan.sequence_parallel:
        notes.append("torchtitan applies sequence parallelism with tensor parallelism itself")
    _check_torchtitan(sections)
    text = "".join(_toml_section(name, values) for name, values in sections.items())
    return Export("torchtitan", text, sections, "torchtitan.toml", tuple(notes))


def _check_torchtitan(sections: dict[str, dict[str, Any]]) -> None:
    for name, values in sections.items():
        known = TORCHTITAN.get(name)
        if known is None:
            raise ExportError(f"torchtitan's job file has no section [{name}]")
        for key, value in values.items():
            if key not in known:
                raise ExportError(f"torchtitan's [{name}] has no key {key}")
            kinds, allowed = known[key]
            if not isinstance(value, kinds) or (allowed is not None and value not in allowed):
                raise ExportError(f"torchtitan's [{name}] {key} does not take {value!r}")


def _toml_section(name: str, values: dict[str, Any]) -> str:
    lines = [f"[{name}]"]
    for key, value in values.items():
        lines.append(f"{key} = {json.dumps(value)}")  # TOML strings and numbers as JSON's
    return "\n".join(lines) + "\n\n"


def export(tool: str, plan: Plan, shape: GptShape) -> Export:
    """The export for ``tool`` (one of :data:`TOOLS`)."""
    makers = {
        "megatron": megatron_args,
        "deepspeed": deepspeed_config,
        "torchtitan": torchtitan_toml,
    }
    if tool not in makers:
        raise ExportError(f"unknown tool {tool!r}: choose one of {', '.join(TOOLS)}")
    return makers[tool](plan, shape)
