"""Strategies that leave the workbench: every strategy the search can choose for the
built-in example exports to Megatron-LM, DeepSpeed and torchtitan with only options
those tools document, and the files read back as the same strategy."""

from __future__ import annotations

import argparse
import json
import shlex
import tomllib

import pytest

from ir.search.space import strategies
from workbench.example import example_model
from workbench.export import (
    TOOLS,
    ExportError,
    GptShape,
    Plan,
    _check_megatron,
    deepspeed_config,
    export,
    gpt_shape,
    megatron_args,
    torchtitan_toml,
)
from workbench.export_options import MEGATRON

SHAPE = gpt_shape(example_model())


def _megatron_parser() -> argparse.ArgumentParser:
    """A parser of the documented options alone (what Megatron-LM's own would accept)."""
    parser = argparse.ArgumentParser(allow_abbrev=False)
    for option, (kind, choices) in MEGATRON.items():
        if kind == "flag":
            parser.add_argument(option, action="store_true")
        else:
            parser.add_argument(option, type=int if kind == "int" else str, choices=choices)
    return parser


def test_the_example_is_read_as_the_gpt_it_is() -> None:
    assert GptShape(layers=4, hidden=512, heads=8, seq=128, vocab=4096, batch=16) == SHAPE


def _exportable(s) -> bool:
    try:
        Plan.of(s)
        return SHAPE.heads % s.tp == 0 and SHAPE.layers % (s.pp * s.chunks) == 0
    except ExportError:
        return False


SPACE = [
    s
    for s in strategies(
        8, SHAPE.batch, zero=(0, 1, 3), sequence_parallel=(False, True), recompute=(False, True)
    )
    if _exportable(s)
]


@pytest.mark.parametrize("strategy", SPACE, ids=str)
def test_each_strategy_exports_to_every_tool_and_reads_back(strategy) -> None:
    plan = Plan.of(strategy)
    # Megatron-LM: its parser (the documented options only) reads the same degrees back
    words = shlex.split(megatron_args(plan, SHAPE).text.replace("\\\n", " "))
    assert words[:3] == ["torchrun", "--nproc_per_node", "8"] and words[3] == "pretrain_gpt.py"
    args = _megatron_parser().parse_args(words[4:])
    world = int(words[2])
    assert (
        args.tensor_model_parallel_size == plan.tp and args.pipeline_model_parallel_size == plan.pp
    )
    dp = world // (plan.tp * plan.pp)
    assert dp == plan.dp
    assert args.micro_batch_size * plan.microbatches * dp == args.global_batch_size == SHAPE.batch
    assert args.sequence_parallel == plan.sequence_parallel
    assert args.use_distributed_optimizer == (plan.zero in (1, 2))
    assert (args.recompute_granularity == "full") == plan.recompute
    # DeepSpeed: the batch identity its config checks
    ds = json.loads(deepspeed_config(plan, SHAPE).text)
    per_gpu, accumulate = ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]
    data_parallel = world // (ds.get("tensor_parallel", {}).get("autotp_size", 1) * plan.pp)
    assert per_gpu * accumulate * data_parallel == ds["train_batch_size"] == SHAPE.batch
    assert ds["zero_optimization"]["stage"] == plan.zero
    # torchtitan: the degrees cover the world, the batches agree
    job = tomllib.loads(torchtitan_toml(plan, SHAPE).text)
    p = job["parallelism"]
    degrees = (
        p["data_parallel_replicate_degree"]
        * p["data_parallel_shard_degree"]
        * p["tensor_parallel_degree"]
        * p["pipeline_parallel_degree"]
    )
    assert degrees == plan.devices == world
    assert job["training"]["local_batch_size"] * plan.dp == job["training"]["global_batch_size"]
    if plan.pp > 1:
        micro = p["pipeline_parallel_microbatch_size"]
        assert job["training"]["local_batch_size"] // micro == plan.microbatches


def test_what_a_tool_cannot_express_is_said() -> None:
    gpipe = megatron_args(Plan(pp=2, microbatches=4, schedule="gpipe"), SHAPE)
    assert any("no GPipe" in n for n in gpipe.notes)
    zero1 = torchtitan_toml(Plan(dp=8, zero=1), SHAPE)
    assert any("ZeRO-1 has no torchtitan switch" in n for n in zero1.notes)
    pipeline = deepspeed_config(Plan(dp=4, pp=2, microbatches=4), SHAPE)
    assert any("num_stages=2" in n for n in pipeline.notes)


def test_an_option_or_value_a_tool_does_not_document_is_refused() -> None:
    with pytest.raises(ExportError, match=r"no option --tensor-parallel-size"):
        _check_megatron([("--tensor-parallel-size", 2)])
    with pytest.raises(ExportError, match="--optimizer does not take 'adamw'"):
        _check_megatron([("--optimizer", "adamw")])
    with pytest.raises(ExportError, match="does not split"):
        megatron_args(Plan(dp=2, microbatches=3), SHAPE)
    with pytest.raises(ExportError, match="tp=3 does not divide"):
        deepspeed_config(Plan(tp=3), SHAPE)
    with pytest.raises(ExportError, match="unknown tool"):
        export("horovod", Plan(), SHAPE)


def test_a_program_that_is_not_a_gpt_says_so() -> None:
    from ir import models

    with pytest.raises(ExportError, match=r"not a GPT of ir\.models\.gpt"):
        gpt_shape(models.mlp(8, 4, 8, 4))


def test_the_dashboard_exports_the_strategy_it_shows(tmp_path, monkeypatch) -> None:
    import ir
    from workbench import Workbench

    monkeypatch.chdir(tmp_path)
    wb = Workbench(example_model(), ir.Topology.preset("a100-hgx", 8))
    assert wb.set_strategy(dp=2, hp=2, pp=2, microbatches=4, schedule="1f1b")
    for tool in TOOLS:
        wb.export_panel.tool.value = tool
        wb.export_panel.button.click()  # what the browser's click does
        written = tmp_path / wb.export_panel.last.filename
        assert written.read_text() == wb.export_panel.text.value == wb.export_panel.last.text
        assert "2" in wb.export_panel.last.text
    assert wb.set_strategy(dp=8)
    wb.export_panel.tool.value = "megatron"
    wb.export_panel.button.click()
    assert "--tensor-model-parallel-size 1" in wb.export_panel.text.value
    wb.annotate("tokens", (ir.sharding.Mesh((8,)), [ir.sharding.S(0)]))
    wb.export_panel.button.click()  # annotations are not a strategy of the tools
    assert "ready transforms" in wb.export_panel.status.value


def test_expert_and_context_parallelism_are_refused_not_left_out() -> None:
    from ir.search import Strategy as SearchStrategy
    from workbench import Strategy

    for s in (Strategy(dp=4, ep=2), SearchStrategy(2, 1, 1, cp=2)):
        with pytest.raises(ExportError, match=r"(ep|cp)=2: expert and context parallelism"):
            Plan.of(s)
    assert Plan.of(Strategy(dp=4, zero=3)).zero == 3  # ZeRO is exported
