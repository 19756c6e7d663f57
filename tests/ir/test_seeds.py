"""The programs of seeds 000, 002 and 003, parsed as written.

Every ```Python block (``python`` too, and the fences whose first line is
``Python``) is in TABLE. A block either parses (with SIZES) and round-trips
through the printer, or fails with a ParseError at a recorded line whose
message holds a recorded phrase: the seeds contain real typos, and each row
says which. A row may go on with *fixes*: the smallest edits that repair the
typo, after which the block fails at its next typo or parses. So the table
shows both that each typo is reported where it is and that the parser takes the
program the author meant. The fixed programs are also executed and compared
with the sequential program.

The seed files are vendored in tests/ir/seeds/ (a fresh clone has no
../shared); a test checks that the copies equal the originals when those exist.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import ir

HERE = Path(__file__).parent / "seeds"
ORIGINALS = Path(__file__).resolve().parents[3] / "shared" / "seeds"
SEED_FILES = {
    "000": "000_f2185f4f2be81a32.txt",
    "002": "002_d19ac5315b09a78d.txt",
    "003": "003_f038b1fffe836759.txt",
}
SIZES = {"B": 8, "F": 4, "H": 6, "C": 2, "N": 2, "K": 2}


def seed_blocks(seed: str) -> list[str]:
    """The code of each Python block of a seed, in order."""
    text = (HERE / SEED_FILES[seed]).read_text()
    blocks = []
    for m in re.finditer(r"```(\w*)\n(.*?)```", text, re.S):
        lang, body = m.group(1), m.group(2)
        if lang.lower() == "python":
            blocks.append(body)
        elif lang == "" and body.startswith("Python\n"):
            blocks.append(body[len("Python\n") :])
    return blocks


@dataclass(frozen=True)
class Fails:
    """A ParseError at ``line`` (of the block) whose message contains ``phrase``."""

    line: int
    phrase: str
    why: str


PARSES = None


@dataclass(frozen=True)
class Step:
    """Edits (old, new) applied, all occurrences, on top of the earlier steps'; then ``expect``."""

    fixes: tuple[tuple[str, str], ...]
    expect: Fails | None


@dataclass(frozen=True)
class Block:
    seed: str
    index: int
    title: str
    steps: tuple[Step, ...]


def as_written(expect: Fails | None) -> Step:
    return Step((), expect)


# Edits shared by several rows.
DL_SEQ = ("dl: Float[0] = LossGrad", "dl: Tensor[(B, C), 0] = LossGrad")
WA_BCAST_12 = ("broadcast(x, devices=[1, 2])\n    as", "broadcast(wA, devices=[1, 2])\n    as")
PAREN = ("d])): {", "d]): {")
TENSOR_PAREN = "Tensor(...) written for Tensor[...] (seed typo)"
LOSSGRAD = "seed typo: LossGrad returns dLoss/dy, a tensor shaped like y, not a scalar"

TABLE: tuple[Block, ...] = (
    # ---- seed 000: the IR and the MLP training program ----
    Block("000", 0, "sequential MLP training", (
        as_written(Fails(8, "'dl' is declared Float[0] but LossGrad gives Tensor[(8, 2), 0]",
                         LOSSGRAD)),
        Step((DL_SEQ,), PARSES),
    )),
    Block("000", 1, "data parallel", (
        as_written(Fails(23, "'dli' is declared Float[d] but LossGrad gives", LOSSGRAD)),
        Step((("dli: Float[d] = LossGrad", "dli: Tensor[(B/N, C), d] = LossGrad"),),
             Fails(43, "the pmap body ends without 'return'",
                   "seed typo: the optimizer pmap's body has no return")),
        Step((("dwAi)\n        },", "dwAi)\n            return wA1i, wB1i\n        },"),),
             Fails(48, "expected a shape and a device",
                   "seed typo: Tensor[] has no shape or device")),
        Step((("wA1: Tensor[] =", "wA1: Tensor[(F, H), 0] ="),
              ("wB1: Tensor[] =", "wB1: Tensor[(H, C), 0] =")),
             Fails(50, "to close the '(' at line 50, column 15, found '?'",
                   "placeholder in the seed: gather(ys, ??)")),
        Step((("y = gather(ys, ??)", "y: Tensor[(B, C), 0] = gather(ys, dim=0, to_device=0)"),
              ("l = reduce(ls, ??)", "l: Float[0] = reduce(ls, to_device=0)")),
             PARSES),
    )),
    Block("000", 2, "horizontal parallel", (
        as_written(Fails(10, "the pmap body returns 1 value(s) (yi) but the statement names 2",
                         "seed typo: the first body returns yi but not ai")),
        Step((("            return yi\n", "            return yi, ai\n"),),
             Fails(31, "a missing ',' between parameters",
                   "seed typo: no comma after the (ai: ...) parameter")),
        Step((("(ai: Tensor[(B, H/N), d])\n", "(ai: Tensor[(B, H/N), d]),\n"),),
             Fails(33, "'dl' is declared Float[d]", LOSSGRAD)),
        Step((("dl: Float[d] = LossGrad", "dl: Tensor[(B, C), d] = LossGrad"),),
             Fails(35, "undefined value 'xi'",
                   "seed typo: the second body reads xi, which it is not given")),
        Step((("fn=lambda (y: Tensor", "fn=lambda (xi: Tensor[(B, F), d]), (y: Tensor"),
              ("(ys, zs, ais, wAs, wBs)", "(xs, ys, zs, ais, wAs, wBs)")),
             Fails(42, "Gather: operand 0 must be a non-empty per-device tuple",
                   "seed typo: gather(wA1s[0], ...) gathers one shard, not the tuple")),
        Step((("gather(wA1s[0], to_device=0)", "gather(wA1s, dim=1, to_device=0)"),
              ("gather(wB1s[0], to_device=0)", "gather(wB1s, dim=0, to_device=0)")),
             PARSES),
    )),
    Block("000", 3, "model parallel", (
        as_written(Fails(10, "'dl' is declared Float[1] but LossGrad gives", LOSSGRAD)),
        Step((("dl: Float[1] = LossGrad", "dl: Tensor[(B, C), 1] = LossGrad"),), PARSES),
    )),
    Block("000", 4, "pipeline parallel, unrolled", (
        as_written(Fails(6, "expected '[' after 'Tensor'", TENSOR_PAREN)),
        Step((("Tuple[Tensor(B/K, F), 0]", "Tuple[Tensor[(B/K, F), 0], Tensor[(B/K, F), 0]]"),
              ("Tuple[Tensor(B/K, 1), 1]", "Tuple[Tensor[B/K, 1], Tensor[B/K, 1]]"),
              ("z: Tuple[Tensor[B, 1], Tensor[B, 1]]", "z: Tensor[B, 1]")),
             Fails(13, "'a0_0' is declared Tensor[(4, 4), 0] but MatMul gives Tensor[(4, 6), 0]",
                   "seed typo: the activation is (B/K, H), not (B/K, F)")),
        Step((("a0_0: Tensor[(B/K, F), 0]", "a0_0: Tensor[(B/K, H), 0]"),),
             Fails(22, "unknown op 'par'",
                   "par(...) is not an op: the seed itself asks whether par is needed; order "
                   "and devices express parallelism (the rest also uses infix dwA_0 + dwA_1)")),
    )),
    Block("000", 5, "pipeline parallel with PipelinePartition", (
        as_written(Fails(6, "expected '[' after 'Tensor'", TENSOR_PAREN)),
        Step((("Tuple[Tensor(B/K, F), 0]", "Tuple[Tensor[(B/K, F), 0], Tensor[(B/K, F), 0]]"),
              ("Tuple[Tensor(B/K, 1), 1]", "Tuple[Tensor[B/K, 1], Tensor[B/K, 1]]"),
              ("z: Tuple[Tensor[B, 1], Tensor[B, 1]]", "z: Tensor[B, 1]")),
             Fails(10, "cannot tell how many tensors '...' stands for",
                   "Tuple[T@0, ..., T@0]: the length of a same-device tuple is not written")),
        Step((("0], ..., Tensor[(F, H), 0]]\n", "0], Tensor[(F, H), 0]],\n"),
              ("1], ..., Tensor[(H, C), 1]]\n", "1], Tensor[(H, C), 1]],\n"),
              ("1], ..., Tensor[(B/K, C), 1]]", "1], Tensor[(B/K, C), 1]]"),
              ("Float[1], ..., Float[1]", "Float[1], Float[1]")),
             Fails(14, "unknown op 'PipelinePartition'",
                   "PipelinePartition is a proposal in the seed, not an op")),
    )),
    Block("000", 6, "activation recomputation", (
        as_written(Fails(8, "found the bare call free(...); and 'free' is not a known op",
                         "free(a): the seed decides against explicit free (liveness instead)")),
        Step((("    free(a)\n", ""), DL_SEQ),
             Fails(11, "duplicate definition of 'a' (first defined at line 5",
                   "a value is defined once: the recomputed a needs a new name")),
        Step((("    a: Tensor[(B, H), 0] = MatMul(x, wA)\n    (dwB",
               "    a2: Tensor[(B, H), 0] = MatMul(x, wA)\n    (dwB"),
              ("MatMulGrad(a, wB, dl)", "MatMulGrad(a2, wB, dl)")),
             PARSES),
    )),
    # ---- seed 002: nested pmap, sub-devices, device maps ----
    Block("002", 0, "matmul", (
        as_written(Fails(3, "'wAs' is declared Tuple[Tensor[(4, 6), 1], Tensor[(4, 6), 2]] but "
                            "broadcast gives Tuple[Tensor[(8, 4), 1]",
                         "seed typo: broadcast(x) where broadcast(wA) is meant")),
        Step((WA_BCAST_12,), PARSES),
    )),
    Block("002", 1, "matmul_dp", (
        as_written(Fails(3, "'wAs' is declared", "seed typo: broadcast(x) for broadcast(wA)")),
        Step((WA_BCAST_12,), PARSES),
    )),
    Block("002", 2, "nested pmap with sub-devices d.1 and a device_map", (
        as_written(Fails(3, "'wAs' is declared", "seed typo: broadcast(x) for broadcast(wA)")),
        Step((WA_BCAST_12,),
             Fails(7, "undefined value 'x' in this pmap body",
                   "seed typo: the body broadcasts the outer x, not its parameter xi")),
        Step((("broadcast(x, devices=[d, d.1])", "broadcast(xi, devices=[d, d.1])"),),
             Fails(8, "undefined value 'wA' in this pmap body", "seed typo: wA for wAi")),
        Step((("scatter(wA, dim=1, devices=[d, d.1])", "scatter(wAi, dim=1, devices=[d, d.1])"),),
             Fails(12, "expected ',' and a device after the tensor's shape",
                   "seed typo: Tensor[(B/2, H/2)] has no device")),
        Step((("aij: Tensor[(B/2, H/2)] =", "aij: Tensor[(B/2, H/2), dd] ="),), PARSES),
    )),
    Block("002", 3, "device map as a value", (
        as_written(Fails(2, "expected an op call such as MatMul(x, w) after '=', found '{'",
                         "device_map = {...} as a statement: a design sketch; device maps are "
                         "pmap attributes in the format")),
        Step((("    device_map = {\n        1: [1, 3],\n        2: [2, 4],  # etc\n    }\n", ""),),
             Fails(2, "undefined name 'device_map' in an attribute value",
                   "devices=device_map.keys(): a sketch, not an attribute value")),
    )),
    Block("002", 4, "device arithmetic", (
        as_written(Fails(3, "found '('", "device_tree = (...): a placeholder in the sketch")),
        Step((("    device_tree = (...)\n", ""),
              ("Tensor[(F, H), 3]] = broadcast(x,", "Tensor[(F, H), 3]] = broadcast(wA,")),
             Fails(8, "device arithmetic on the device variable 'd' is not supported",
                   "d+1: the seed shows device arithmetic to argue against it")),
    )),
    Block("002", 5, "DeviceMap class proposal", (
        as_written(Fails(1, "expected 'def' at the start of the program",
                         "Python code of a proposed class, not a DistIR program")),
    )),
    Block("002", 6, "device map literal", (
        as_written(Fails(1, "expected 'def' at the start of the program",
                         "a Python dict, not a DistIR program")),
    )),
    Block("002", 7, "matmul with device_keys", (
        as_written(Fails(2, "expected a type", "device_map: DeviceMap = ...: a proposal")),
        Step((("    device_map: DeviceMap = {1: [1, 3], 2: [2, 4]}\n", ""),),
             Fails(2, "Scatter has no attribute 'device_keys'",
                   "device_keys=[] is the proposal's attribute, not Scatter's")),
    )),
    Block("002", 8, "matmul with device_keys, horizontal inside", (
        as_written(Fails(2, "expected a type", "device_map: DeviceMap = ...: a proposal")),
        Step((("    device_map: DeviceMap = {1: [1, 3], 2: [2, 4]}\n", ""),),
             Fails(2, "Scatter has no attribute 'device_keys'",
                   "device_keys=[] is the proposal's attribute, not Scatter's")),
    )),
    # ---- seed 003: composable transforms ----
    Block("003", 0, "original function", (as_written(PARSES),)),
    Block("003", 1, "data parallelism", (as_written(PARSES),)),
    Block("003", 2, "horizontal parallelism", (
        as_written(Fails(6, "'wBs' is declared Tuple[Tensor[(6, 1), 1], Tensor[(6, 1), 2]] but "
                            "scatter gives",
                         "seed typo: wB scattered on dim 0 gives (H/N, C), not (H, C/N)")),
        Step((("wBs: Tuple[Tensor[(H, C/N), 1], ..., Tensor[(H, C/N), N]]",
               "wBs: Tuple[Tensor[(H/N, C), 1], ..., Tensor[(H/N, C), N]]"),),
             Fails(13, "MatMul: contraction dimensions differ",
                   "seed typo: the body's wBi is (F/N, C), not (H/N, C)")),
        Step((("(wBi: Tensor[(F/N, C), d])", "(wBi: Tensor[(H/N, C), d])"),),
             Fails(8, "'yis' is declared", "seed typo: partial sums are (B, C), not (B, C/N)")),
        Step((("Tuple[Tensor[(B, C/N), 1], ..., Tensor[(B, C/N), N]]",
               "Tuple[Tensor[(B, C), 1], ..., Tensor[(B, C), N]]"),),
             PARSES),
    )),
    Block("003", 3, "pipeline parallelism", (
        as_written(Fails(4, "expected '[' after 'Tensor'", TENSOR_PAREN)),
        Step((("Tuple[Tensor(B/K, F), 0], ..., Tensor[(B/K, F), 0]]",
               "Tuple[Tensor[(B/K, F), 0], Tensor[(B/K, F), 0]]"),),
             Fails(9, "'a0' is declared Tensor[(4, 6), 1] but MatMul gives Tensor[(4, 6), 0]",
                   "the seed's own TODO: the sends of xs, wA, wB to device 1 are missing")),
        Step((("Tensor[(B/K, H), 1] = MatMul", "Tensor[(B/K, H), 0] = MatMul"),),
             Fails(10, "expected '=' after the results of a statement",
                   "a0@2 is not a name (the seed's notation for 'a0 on device 2')")),
    )),
    Block("003", 4, "data then horizontal", (
        as_written(Fails(4, "'xs' is declared Tuple[Tensor[(8, 4), 1], Tensor[(8, 4), 2]] but "
                            "scatter gives",
                         "seed typo: scattered x is (B/N, F), not (B, F)")),
        Step((("Tuple[Tensor[(B, F), 1], ..., Tensor[(B, F), N]] = scatter",
               "Tuple[Tensor[(B/N, F), 1], ..., Tensor[(B/N, F), N]] = scatter"),),
             Fails(11, "found ')' (an unmatched closing bracket?)",
                   "seed typo: one ')' too many after the lambda's parameters")),
        Step((PAREN,), PARSES),
    )),
    Block("003", 5, "horizontal then data", (
        as_written(Fails(11, "found ')' (an unmatched closing bracket?)",
                         "seed typo: one ')' too many after the lambda's parameters")),
        Step((PAREN,),
             Fails(20, "element 0 of pmap operand 0 is Tensor[(8, 6), 1], but the body's input "
                       "'ai' bound to device 1 is Tensor[(4, 6), 1]",
                   "seed error: allgather gives every device all of a (B, H); the data "
                   "parallel stage needs a (B/N, H) shard, i.e. a scatter")),
    )),
    Block("003", 6, "data over horizontal", (
        as_written(Fails(4, "cannot expand '...' between devices ? and ?",
                         "devices left as ?: the tuple's length is not written")),
    )),
    Block("003", 7, "horizontal over data", (
        as_written(Fails(4, "cannot expand the device range ?..?",
                         "devices=[?..?]: the device list is not written")),
        Step((("[?..?]", "[1..N]"),),
             Fails(4, "'xs_hp' is declared", "seed typo: broadcast x is (B, F), not (B/N, F)")),
        Step((("xs_hp: Tuple[Tensor[(B/N, F), 1], ..., Tensor[(B/N, F), N]]",
               "xs_hp: Tuple[Tensor[(B, F), 1], ..., Tensor[(B, F), N]]"),),
             Fails(5, "the tensors around '...' must differ only in their device",
                   "seed typo: H/H for H/N in the tuple's last element")),
        Step((("H/H), N]] = scatter(wA_hp", "H/N), N]] = scatter(wA_hp"),),
             Fails(5, "undefined value 'wA_hp'", "seed typo: wA_hp is used before it exists")),
    )),
    Block("003", 8, "data over pipeline", (
        as_written(Fails(4, "cannot expand the device range ?..?",
                         "devices=[?..?]: the device list is not written")),
    )),
    Block("003", 9, "horizontal over pipeline", (
        as_written(Fails(4, "cannot expand '...' between devices ? and ?",
                         "devices left as ?: the tuple's length is not written")),
    )),
)  # fmt: skip

ROWS = {(b.seed, b.index): b for b in TABLE}


def _ids(block: Block) -> str:
    return f"{block.seed}-{block.index}-{block.title.replace(' ', '_')}"


def text_after(block: Block, steps: int) -> str:
    """The block's code with the fixes of its first ``steps`` steps applied."""
    text = seed_blocks(block.seed)[block.index]
    for step in block.steps[:steps]:
        for old, new in step.fixes:
            assert old in text, f"fix {old!r} does not apply to {_ids(block)}"
            text = text.replace(old, new)
    return text


def check(text: str, expect: Fails | None) -> ir.Function | None:
    if expect is None:
        f = ir.parse(text, SIZES)
        printed = str(f)
        back = ir.parse(printed)
        assert back.is_equivalent(f)
        assert str(back) == printed
        return f
    with pytest.raises(ir.ParseError) as info:
        ir.parse(text, SIZES)
    e = info.value
    assert (e.line, expect.phrase in e.message) == (expect.line, True), str(e)
    assert e.column >= 1 and e.source_line == text.split("\n")[e.line - 1]
    return None


def test_the_table_has_one_row_per_block():
    blocks = {(seed, i) for seed in SEED_FILES for i in range(len(seed_blocks(seed)))}
    assert set(ROWS) == blocks
    assert len(ROWS) == len(TABLE)
    assert all(block.steps and not block.steps[0].fixes for block in TABLE)


@pytest.mark.parametrize("block", TABLE, ids=_ids)
def test_seed_block_as_written(block: Block):
    check(text_after(block, 0), block.steps[0].expect)


@pytest.mark.parametrize("block", [b for b in TABLE if len(b.steps) > 1], ids=_ids)
def test_seed_block_typo_by_typo(block: Block):
    for n, step in enumerate(block.steps[1:], start=2):
        check(text_after(block, n), step.expect)


def test_vendored_seeds_equal_the_originals():
    if not ORIGINALS.is_dir():
        pytest.skip(f"the original seeds are not next to this checkout ({ORIGINALS})")
    for name in SEED_FILES.values():
        assert (HERE / name).read_text() == (ORIGINALS / name).read_text(), name


# -- the fixed programs compute what the sequential program computes ---------------------


def fixed(seed: str, index: int) -> ir.Function:
    block = ROWS[(seed, index)]
    assert block.steps[-1].expect is None, "this block does not parse even when fixed"
    return ir.parse(text_after(block, len(block.steps)), SIZES)


@pytest.fixture
def mlp_inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    B, F, H, C = (SIZES[k] for k in "BFHC")
    return {
        "wA": rng.standard_normal((F, H)).astype(np.float32),
        "wB": rng.standard_normal((H, C)).astype(np.float32),
        "x": rng.standard_normal((B, F)).astype(np.float32),
        "z": rng.integers(0, C, B).astype(np.float32),
    }


@pytest.mark.parametrize("index", [2, 3], ids=["horizontal", "model_parallel"])
def test_fixed_parallel_training_programs_equal_the_sequential_one(index, mlp_inputs):
    want = ir.execute(fixed("000", 0), mlp_inputs)  # wA1, wB1, y, l
    got = ir.execute(fixed("000", index), mlp_inputs)
    for name, g, w in zip(("wA1", "wB1", "y", "l"), got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=name)


def test_fixed_data_parallel_program_computes_the_same_forward_pass(mlp_inputs):
    # The seed's per-device losses average over B/N rows, so only y is comparable.
    _, _, y_seq, _ = ir.execute(fixed("000", 0), mlp_inputs)
    _, _, y_dp, _ = ir.execute(fixed("000", 1), mlp_inputs)
    np.testing.assert_allclose(y_dp, y_seq, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("index", [0, 1, 2], ids=["matmul", "matmul_dp", "nested_pmap"])
def test_fixed_seed_002_programs_compute_x_times_wa(index, mlp_inputs):
    (a,) = ir.execute(fixed("002", index), {k: mlp_inputs[k] for k in ("wA", "x")})
    np.testing.assert_allclose(a, mlp_inputs["x"] @ mlp_inputs["wA"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("index", [1, 2, 4], ids=["data", "horizontal", "data_then_horizontal"])
def test_seed_003_programs_compute_the_mlp(index, mlp_inputs):
    inputs = {k: mlp_inputs[k] for k in ("wA", "wB", "x")}
    want = inputs["x"] @ inputs["wA"] @ inputs["wB"]
    block = ROWS[("003", index)]
    f = ir.parse(text_after(block, len(block.steps)), SIZES)
    (y,) = ir.execute(f, inputs)
    for part in y if isinstance(y, tuple) else (y,):  # horizontal returns one copy per device
        np.testing.assert_allclose(part, want, rtol=1e-5, atol=1e-6)
