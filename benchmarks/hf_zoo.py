"""Hugging Face architectures as they come, through ``ir.from_torch``: the zoo.

Each architecture is its ``transformers`` model class built from a small config (a few
layers and heads, hidden 32, random weights; nothing is downloaded) with every other
setting left at its default: scaled dot-product attention, ``use_cache=True`` for
decoders, the model's own output object. For each, in eval mode:

* ``imports``: ``ir.from_torch(model, (inputs,))`` gives a program;
* ``executes``: ``ir.execute`` equals torch's forward, every output (the caches' tensors
  included), rtol 1e-4;
* ``trains``: a training step of the imported program (a loss on its first output,
  ``ir.models.with_loss``: cross-entropy for a language model's logits, mean square
  error otherwise; SGD) updates every weight as torch's autograd and SGD do (rtol 1e-3);
* ``shards``: that step distributed over 2 devices by data, tensor and pipeline
  parallelism executes equal to the sequential step: ``T.megatron`` (dp=2; tp=2;
  pp=2 with 2 microbatches) where it takes the model, else the next method that does
  (``T.data_parallel``; the largest weight annotated ``S(0)`` and propagated;
  ``T.pipeline_parallel``); the table says which.

    python benchmarks/hf_zoo.py [--only llama bert ...] [--write-docs]

``tests/importers/test_hf_zoo.py`` checks a fixed sample in every run and every
architecture (and the table in ``docs/importers.md``) under ``-m slow``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout, installed or not
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the zoo never downloads

import numpy as np

import ir
from ir.errors import DistIRError

DOCS = Path(__file__).resolve().parents[1] / "docs" / "importers.md"
BEGIN, END = "<!-- hf-zoo:begin -->", "<!-- hf-zoo:end -->"
VOCAB = 64
STRATEGIES = ("data", "tensor", "pipeline")


@dataclass(frozen=True)
class Arch:
    """One architecture: its family, how to build it, and what it reads."""

    name: str
    family: str  # decoder, encoder, encoder-decoder encoder, vision transformer, CNN
    build: Callable[[], object]
    inputs: Callable[[int], tuple]
    language_model: bool = False  # its first output is logits over VOCAB tokens


def _ids(batch: int) -> tuple:
    import torch

    return (torch.randint(0, VOCAB, (batch, 8), generator=torch.Generator().manual_seed(1)),)


def _pixels(batch: int, size: int = 32) -> tuple:
    import torch

    return (torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(2)),)


def _features(batch: int) -> tuple:
    import torch

    return (torch.randn(batch, 8, 32, generator=torch.Generator().manual_seed(3)),)


SMALL = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    vocab_size=VOCAB,
    max_position_embeddings=32,
)


def _built(model: str, config: str, **settings) -> Callable[[], object]:
    """A builder of ``transformers.<model>(transformers.<config>(**settings))``."""

    def build():
        import transformers

        return getattr(transformers, model)(getattr(transformers, config)(**settings))

    return build


def _encoder_of(model: str, config: str, **settings) -> Callable[[], object]:
    """The encoder of an encoder-decoder model (``get_encoder()``)."""
    whole = _built(model, config, **settings)
    return lambda: whole().get_encoder()


LM, ENC, ENC_DEC, VISION, CNN = (
    "decoder",
    "encoder",
    "encoder-decoder encoder",
    "vision transformer",
    "CNN",
)
GQA = dict(num_key_value_heads=2)
MOE = dict(num_local_experts=4, num_experts_per_tok=2)  # Mixtral's names
QWEN_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
TINY = dict(n_embd=32, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=32)
SEQ2SEQ = dict(
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    vocab_size=VOCAB,
    pad_token_id=1,
    bos_token_id=0,
    eos_token_id=2,
    decoder_start_token_id=2,
)
IMAGES = dict(
    image_size=32,
    patch_size=8,
    **{k: v for k, v in SMALL.items() if "vocab" not in k and "position" not in k},
    num_labels=5,
)


def _lm(name: str, model: str, config: str, **settings) -> Arch:
    return Arch(name, LM, _built(model, config, **settings), _ids, True)


def _zoo() -> list[Arch]:
    return [
        _lm("gpt2", "GPT2LMHeadModel", "GPT2Config", **TINY, bos_token_id=0, eos_token_id=0),
        _lm("llama", "LlamaForCausalLM", "LlamaConfig", **SMALL, **GQA),
        _lm("mistral", "MistralForCausalLM", "MistralConfig", **SMALL, **GQA),
        _lm("qwen2", "Qwen2ForCausalLM", "Qwen2Config", **SMALL, **GQA),
        _lm("qwen3", "Qwen3ForCausalLM", "Qwen3Config", **SMALL, head_dim=8, **GQA),
        _lm("gemma", "GemmaForCausalLM", "GemmaConfig", **SMALL, head_dim=8, num_key_value_heads=1),
        _lm("gemma2", "Gemma2ForCausalLM", "Gemma2Config", **SMALL, head_dim=8, **GQA),
        _lm("phi", "PhiForCausalLM", "PhiConfig", **SMALL),
        _lm("phi3", "Phi3ForCausalLM", "Phi3Config", **SMALL, pad_token_id=0, **GQA),
        _lm(
            "opt",
            "OPTForCausalLM",
            "OPTConfig",
            **{k: v for k, v in SMALL.items() if k != "intermediate_size"},
            ffn_dim=64,
            word_embed_proj_dim=32,
        ),
        _lm("gpt_neox", "GPTNeoXForCausalLM", "GPTNeoXConfig", **SMALL),
        _lm("gptj", "GPTJForCausalLM", "GPTJConfig", **TINY, rotary_dim=4),
        _lm("falcon", "FalconForCausalLM", "FalconConfig", **SMALL),
        _lm(
            "bloom",
            "BloomForCausalLM",
            "BloomConfig",
            hidden_size=32,
            n_layer=2,
            n_head=4,
            vocab_size=VOCAB,
        ),
        _lm("stablelm", "StableLmForCausalLM", "StableLmConfig", **SMALL, **GQA),
        _lm("olmo", "OlmoForCausalLM", "OlmoConfig", **SMALL, **GQA),
        _lm("starcoder2", "Starcoder2ForCausalLM", "Starcoder2Config", **SMALL, **GQA),
        _lm("codegen", "CodeGenForCausalLM", "CodeGenConfig", **TINY, rotary_dim=4, n_ctx=32),
        _lm(
            "gpt_neo",
            "GPTNeoForCausalLM",
            "GPTNeoConfig",
            hidden_size=32,
            num_layers=2,
            num_heads=4,
            vocab_size=VOCAB,
            max_position_embeddings=32,
            attention_types=[[["global", "local"], 1]],
            window_size=4,
        ),
        _lm("gpt_bigcode", "GPTBigCodeForCausalLM", "GPTBigCodeConfig", **TINY),
        _lm("granite", "GraniteForCausalLM", "GraniteConfig", **SMALL, **GQA),
        # mixture-of-experts decoders: 4 experts, top-2 (docs/experts.md)
        _lm("mixtral", "MixtralForCausalLM", "MixtralConfig", **SMALL, **GQA, **MOE),
        _lm("qwen2_moe", "Qwen2MoeForCausalLM", "Qwen2MoeConfig", **SMALL, **GQA, **QWEN_MOE),
        _lm("qwen3_moe", "Qwen3MoeForCausalLM", "Qwen3MoeConfig", **SMALL, **GQA, **QWEN_MOE),
        _lm("olmoe", "OlmoeForCausalLM", "OlmoeConfig", **SMALL, **GQA, **QWEN_MOE),
        _lm("granitemoe", "GraniteMoeForCausalLM", "GraniteMoeConfig", **SMALL, **GQA, **MOE),
        _lm(
            "glm4_moe",
            "Glm4MoeForCausalLM",
            "Glm4MoeConfig",
            **SMALL,
            **GQA,
            head_dim=8,
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
            n_group=2,
            topk_group=1,
        ),
        Arch("bert", ENC, _built("BertModel", "BertConfig", **SMALL), _ids),
        Arch(
            "roberta",
            ENC,
            _built("RobertaModel", "RobertaConfig", **{**SMALL, "max_position_embeddings": 40}),
            _ids,
        ),
        Arch(
            "distilbert",
            ENC,
            _built(
                "DistilBertModel",
                "DistilBertConfig",
                dim=32,
                n_layers=2,
                n_heads=4,
                hidden_dim=64,
                vocab_size=VOCAB,
                max_position_embeddings=32,
            ),
            _ids,
        ),
        Arch(
            "albert", ENC, _built("AlbertModel", "AlbertConfig", **SMALL, embedding_size=16), _ids
        ),
        Arch(
            "electra",
            ENC,
            _built("ElectraModel", "ElectraConfig", **SMALL, embedding_size=16),
            _ids,
        ),
        Arch(
            "xlm_roberta",
            ENC,
            _built(
                "XLMRobertaModel", "XLMRobertaConfig", **{**SMALL, "max_position_embeddings": 40}
            ),
            _ids,
        ),
        Arch("mpnet", ENC, _built("MPNetModel", "MPNetConfig", **SMALL), _ids),
        Arch("deberta_v2", ENC, _built("DebertaV2Model", "DebertaV2Config", **SMALL), _ids),
        Arch(
            "modernbert",
            ENC,
            _built(
                "ModernBertModel",
                "ModernBertConfig",
                **SMALL,
                pad_token_id=0,
                bos_token_id=1,
                eos_token_id=2,
                cls_token_id=1,
                sep_token_id=2,
            ),
            _ids,
        ),
        Arch(
            "t5_encoder",
            ENC_DEC,
            _built(
                "T5EncoderModel",
                "T5Config",
                d_model=32,
                d_kv=8,
                d_ff=64,
                num_layers=2,
                num_heads=4,
                vocab_size=VOCAB,
            ),
            _ids,
        ),
        Arch(
            "bart_encoder",
            ENC_DEC,
            _encoder_of("BartModel", "BartConfig", **SEQ2SEQ, max_position_embeddings=32),
            _ids,
        ),
        Arch(
            "whisper_encoder",
            ENC_DEC,
            _encoder_of(
                "WhisperModel", "WhisperConfig", **SEQ2SEQ, num_mel_bins=8, max_source_positions=16
            ),
            _features,
        ),
        Arch("vit", VISION, _built("ViTForImageClassification", "ViTConfig", **IMAGES), _pixels),
        Arch("deit", VISION, _built("DeiTForImageClassification", "DeiTConfig", **IMAGES), _pixels),
        Arch(
            "dinov2",
            VISION,
            _built(
                "Dinov2Model",
                "Dinov2Config",
                image_size=32,
                patch_size=8,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                mlp_ratio=2,
            ),
            _pixels,
        ),
        Arch("beit", VISION, _built("BeitForImageClassification", "BeitConfig", **IMAGES), _pixels),
        Arch(
            "swin",
            VISION,
            _built(
                "SwinForImageClassification",
                "SwinConfig",
                image_size=32,
                patch_size=4,
                embed_dim=16,
                depths=[1, 1],
                num_heads=[2, 2],
                window_size=4,
                num_labels=5,
            ),
            _pixels,
        ),
        Arch(
            "levit",
            VISION,
            _built("LevitForImageClassification", "LevitConfig", image_size=32, num_labels=5),
            _pixels,
        ),
        Arch(
            "resnet",
            CNN,
            _built(
                "ResNetForImageClassification",
                "ResNetConfig",
                embedding_size=8,
                hidden_sizes=[8, 16],
                depths=[1, 1],
                num_labels=5,
            ),
            _pixels,
        ),
        Arch(
            "convnext",
            CNN,
            _built(
                "ConvNextForImageClassification",
                "ConvNextConfig",
                hidden_sizes=[8, 16],
                depths=[1, 1],
                num_stages=2,
                num_labels=5,
            ),
            _pixels,
        ),
        Arch(
            "mobilenet_v2",
            CNN,
            _built(
                "MobileNetV2ForImageClassification",
                "MobileNetV2Config",
                depth_multiplier=0.25,
                num_labels=5,
                image_size=32,
            ),
            _pixels,
        ),
        Arch(
            "regnet",
            CNN,
            _built(
                "RegNetForImageClassification",
                "RegNetConfig",
                embedding_size=8,
                hidden_sizes=[8, 16],
                depths=[1, 1],
                groups_width=4,
                num_labels=5,
            ),
            _pixels,
        ),
        Arch(
            "efficientnet",
            CNN,
            _built(
                "EfficientNetForImageClassification",
                "EfficientNetConfig",
                image_size=32,
                width_coefficient=0.25,
                depth_coefficient=0.25,
                hidden_dim=320,
                num_labels=5,
            ),
            _pixels,
        ),
    ]


ZOO = {a.name: a for a in _zoo()}


def model(arch: Arch):
    import torch

    torch.manual_seed(0)
    return arch.build().eval()


def torch_outputs(module, inputs) -> list[np.ndarray]:
    """Every tensor of the module's output (its output object flattened, caches included)."""
    import torch

    with torch.no_grad():
        out = module(*inputs)
    leaves, _ = torch.utils._pytree.tree_flatten(out)
    return [t.detach().numpy() for t in leaves if isinstance(t, torch.Tensor)]


@dataclass
class Row:
    """What one architecture does: a stage per column, and why the first failure failed."""

    arch: str
    family: str
    ops: int = 0
    checks: dict[str, bool] = field(default_factory=dict)
    how: dict[str, str] = field(default_factory=dict)  # the method each strategy took
    why: str = ""
    seconds: float = 0.0


def check_forward(arch: Arch, batch: int = 2):
    """(module, inputs, function, arguments) after checking the forward against torch."""
    module, inputs = model(arch), arch.inputs(batch)
    f, args = ir.from_torch(module, inputs)
    want = torch_outputs(module, inputs)
    got = ir.execute(f, args)
    assert len(got) == len(want), f"{len(got)} outputs, torch gives {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"output {k}")
    return module, inputs, f, args


def first_output(f):
    """``f`` computing its first output only (the ops the others need alone dropped)."""
    from ir.builder import FunctionBuilder, rebuild_op

    needed = {f.outputs[0]}
    kept = []
    for op in reversed(f.ops):
        if any(v in needed for v in op.outputs):
            needed.update(op.inputs)
            kept.append(op)
    b = FunctionBuilder(f.name)
    env = {v: b.input(v.name, v.type) for v in f.inputs}
    for op in reversed(kept):
        env.update(zip(op.outputs, rebuild_op(b, op, [env[v] for v in op.inputs])))
    return b.finish([env[f.outputs[0]]])


def _read_by(f, output) -> set[str]:
    """The inputs of ``f`` that ``output`` depends on."""
    needed, read = {output}, set()
    for op in reversed(f.ops):
        if any(v in needed for v in op.outputs):
            needed.update(op.inputs)
    read = {v.name for v in f.inputs if v in needed}
    return read


def _parameters(module) -> dict[str, object]:
    """Each weight input name of the imported module -> the parameter it holds (a tied
    weight under each of its state-dict names)."""
    from ir.importers import weight_name

    params = {id(p): p for p in module.parameters() if p.requires_grad}
    state = module.state_dict(keep_vars=True)
    return {weight_name(k): params[id(t)] for k, t in state.items() if id(t) in params}


def training_step(arch: Arch, module, inputs, f, args, lr: float = 0.1):
    """The imported SGD step (with its arguments), its trained inputs and torch's updated
    weights (by input name)."""
    import torch

    f = first_output(f)  # a step trains on the model's output, not its key/value caches
    if arch.language_model:
        labels = np.random.default_rng(5).integers(0, VOCAB, f.outputs[0].type.shape[:-1])
        loss_f = ir.models.with_loss(f)
        target = torch.from_numpy(labels)
    else:
        labels = (
            np.random.default_rng(5).standard_normal(f.outputs[0].type.shape).astype(np.float32)
        )
        loss_f = ir.models.with_loss(f, kind="mse")
        target = torch.from_numpy(labels)
    module.zero_grad()
    out = torch.utils._pytree.tree_flatten(module(*inputs))[0][0]
    if arch.language_model:
        loss = torch.nn.functional.cross_entropy(out.reshape(-1, VOCAB), target.reshape(-1))
    else:  # with_loss's mse: the squares of a row summed, the rows averaged
        loss = ((out - target) ** 2).reshape(-1, out.shape[-1]).sum(-1).mean()
    loss.backward()
    params = _parameters(module)
    read = _read_by(loss_f, loss_f.outputs[-1])
    trained = [  # the weights the loss depends on (a BERT's pooler feeds no hidden state)
        v.name
        for v in loss_f.inputs
        if v.name in params and v.name in read and params[v.name].grad is not None
    ]
    t = ir.transforms.training(loss_f, params=trained, lr=lr)
    want = {n: (params[n] - lr * params[n].grad).detach().numpy() for n in trained}
    return t, [*args, labels], want, float(loss.detach())


def check_training(arch: Arch, module, inputs, f, args):
    """(step, its arguments, the trained weights) after checking the step against torch."""
    t, targs, want, loss = training_step(arch, module, inputs, f, args)
    results = ir.execute(t, targs)
    got = dict(zip(want, results))  # the updated weights come first, in input order
    np.testing.assert_allclose(results[-1], loss, rtol=1e-4)
    for name, w in want.items():
        np.testing.assert_allclose(got[name], w, rtol=1e-3, atol=1e-5, err_msg=name)
    return t, targs, list(want)


def _annotated(t, trained: list[str]):
    """The largest trained weight split along its first axis over 2 devices, the rest
    derived by propagation (what clicking one weight in the workbench does)."""
    from ir.sharding import Mesh, S, propagate

    by_name = {v.name: v for v in t.inputs}
    weights = [by_name[n] for n in trained if by_name[n].type.rank >= 2]
    biggest = max(weights, key=lambda v: v.type.num_elements)
    g, _ = propagate(t, {biggest.name: (Mesh((2,)), [S(0)])})
    return g


def methods(strategy: str, trained: list[str]) -> list[tuple[str, Callable]]:
    T = ir.transforms
    return {
        "data": [
            ("megatron(dp=2)", lambda t: T.megatron(t, 2, 1, 1, 1)),
            ("data_parallel(2)", lambda t: T.data_parallel(t, 2)),
        ],
        "tensor": [
            ("megatron(tp=2)", lambda t: T.megatron(t, 1, 2, 1, 1)),
            ("annotation", lambda t: _annotated(t, trained)),
        ],
        "pipeline": [
            ("megatron(pp=2, m=2)", lambda t: T.megatron(t, 1, 1, 2, 2)),
            ("pipeline_parallel(2, m=2)", lambda t: T.pipeline_parallel(t, 2, 2)),
        ],
    }[strategy]


def check_sharding(t, targs, strategy: str, trained: list[str]) -> str:
    """The first method that distributes ``t`` by ``strategy``; its step equals ``t``'s."""
    refusals = []
    want = ir.execute(t, targs)
    for label, build in methods(strategy, trained):
        try:
            g = build(t)
        except DistIRError as e:  # a transform that does not take this model: the next one
            refusals.append(f"{label}: {type(e).__name__}: {' '.join(str(e).split())[:160]}")
            continue
        got = ir.execute_step(g, targs, source=t, rtol=1e-4)
        assert len(got) == len(want)
        for v, o, w in zip(t.outputs, got, want, strict=True):
            np.testing.assert_allclose(o, w, rtol=1e-4, atol=1e-5, err_msg=f"{label}: {v.name}")
        return label
    raise DistIRError("; ".join(refusals))


def run(arch: Arch, batch: int = 6) -> Row:
    """Every stage for ``arch``, stopping at the first that fails."""
    row = Row(arch.name, arch.family)
    start = time.perf_counter()
    stage = "imports"
    try:
        module, inputs, f, args = check_forward(arch, batch)
        row.ops = len(f.ops)
        row.checks["imports"] = row.checks["executes"] = True
        stage = "trains"
        t, targs, trained = check_training(arch, module, inputs, f, args)
        row.checks["trains"] = True
        for strategy in STRATEGIES:
            stage = strategy
            row.how[strategy] = check_sharding(t, targs, strategy, trained)
            row.checks[strategy] = True
    except AssertionError as e:
        if stage == "imports":
            row.checks["imports"], stage = True, "executes"
        row.checks[stage] = False
        row.why = f"{stage}: {' '.join(str(e).split())[:200]}"
    except (DistIRError, Exception) as e:  # what the workbench says, recorded per row
        row.checks[stage] = False
        row.why = f"{stage}: {type(e).__name__}: {' '.join(str(e).split())[:200]}"
    row.seconds = time.perf_counter() - start
    return row


COLUMNS = ("imports", "executes", "trains", *STRATEGIES)


def table(rows: list[Row]) -> str:
    full = [r for r in rows if all(r.checks.get(c) for c in COLUMNS)]
    lines = [
        BEGIN,
        "",
        f"{len(rows)} architectures; {len(full)} import, execute equal, train equal and shard "
        f"(data, tensor, pipeline) equal; "
        + ", ".join(f"{sum(bool(r.checks.get(c)) for r in rows)} {c}" for c in COLUMNS)
        + ".",
        "",
        "| architecture | family | ops | " + " | ".join(COLUMNS) + " | first failure |",
        "|---|---|---|" + "---|" * len(COLUMNS) + "---|",
    ]
    mark = {True: "yes", False: "**no**", None: ""}
    for r in rows:
        cells = " | ".join(r.how.get(c, mark[r.checks.get(c)]) for c in COLUMNS)
        why = r.why.replace("|", "\\|")
        lines.append(f"| {r.arch} | {r.family} | {r.ops} | {cells} | {why} |")
    return "\n".join([*lines, "", END])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", help="only these architectures")
    p.add_argument("--write-docs", action="store_true", help="rewrite docs/importers.md's table")
    args = p.parse_args()
    from tqdm.auto import tqdm

    rows = []
    for name in tqdm(args.only or list(ZOO), desc="architectures"):
        row = run(ZOO[name])
        rows.append(row)
        tqdm.write(f"{row.arch}: {row.checks} {row.seconds:.1f} s {row.why}")
    print(table(rows))
    if args.write_docs:
        text = DOCS.read_text()
        start, end = text.index(BEGIN), text.index(END) + len(END)
        DOCS.write_text(text[:start] + table(rows) + text[end:])


if __name__ == "__main__":
    main()
