"""Fuzz the public surface: mutated program texts, wrong API arguments, mutated executor
inputs, transformed programs, session files and one-op programs, counted by outcome.

    python benchmarks/fuzz.py [--count 10000] [--seed 0] [--timeout-s 5]
                              [--what text,api,transforms,inputs,programs,sessions,ops]

*text*: valid programs (the golden files of ``tests/ir/golden`` and ``ir.format`` of a
few models) mutated by characters (ASCII and non-ASCII), tokens, lines, numbers
(huge, negative, non-integer) and bracket depth, then parsed; a program that parses is
also simulated on a uniform topology over its devices. *api*: public entry points
(``ir.parse``, ``ir.execute``, ``ir.simulate``, ``ir.random_inputs``, ``Topology``,
``transforms.parallelize``, ``Mesh``, ``ShardingSpec``, ``Strategy`` and its text,
``Session.load``, the models' dtypes, the workbench session) called with one argument
replaced by a value of a wrong type or range. *transforms*, *inputs*, *programs*: the
transforms (of sequential and of already-transformed programs), propagation, the
executor and the simulator (``benchmarks/fuzz_transforms.py`` and ``fuzz_programs.py``
say how). *sessions*: session files with a hostile field, and special files and odd
paths to load and save (``benchmarks/fuzz_sessions.py``). *ops*: one-op programs of
every registered op on operands and attributes its examples never have
(``benchmarks/fuzz_ops.py``).

Each input ends in one outcome: ``ok`` (accepted), ``project error`` (a ``DistIRError``:
the promised answer to bad input), ``unlocated error`` (*transforms*: a project error
whose message names neither the parameter nor the value; *sessions*: one naming another
field than the one replaced), ``wrong output`` (*programs*: a transform's result
computes something else than its source, or does not run; *sessions*: a save replaced a
link or changed what it refused; *ops*: a program that does not print and parse back),
``other exception`` (a bug: any other exception type), or ``timeout`` (more than
``--timeout-s``, via SIGALRM). The counts are printed per target with the first few
inputs of each bad outcome; the exit status is 1 when any input ended in one. Issue 17's
and 25's target: none. Seeded and deterministic: the same ``--seed`` draws the same
inputs.
"""

from __future__ import annotations

import argparse
import math
import random
import re
import signal
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import ir
from ir import models
from ir.errors import DistIRError
from ir.sharding import Mesh, ShardingSpec, placement

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling, run from anywhere
import fuzz_ops
import fuzz_programs
import fuzz_sessions
import fuzz_transforms

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "ir" / "golden"

NON_ASCII = ["π", "é", "²", "٣", "\u200b", "\u0301", "ｘ", "𝑥", "\ufeff", "\x00", "\t", "ß"]
NUMBERS = ["0", "-1", "-3", "1.5", "inf", "nan", "1e9", "9" * 30, "9" * 5000, "2**70", "True"]
WRONG = [
    None, True, False, -1, 0, 2**70, -(2**70), 1.5, math.nan, math.inf, "", "x", "dp=2", b"x",
    [], {}, (), (1, 2), [-1], {"a": 1}, object(), np.float32(2), np.array([1, 2]), 10**4000,
    "int8", "a\x00b", [-1, -2], {0: [-1]}, [70000, 0], "dp=2,dp=4", "/dev/zero", b"\x00",
]  # fmt: skip


class InputTimeoutError(Exception):
    """The input ran past --timeout-s."""


def _alarm(_signum: int, _frame: Any) -> None:
    raise InputTimeoutError


def corpus() -> list[str]:
    texts = [p.read_text() for p in sorted(GOLDEN.glob("*.txt"))]
    for f in (
        models.mlp(8, 16, 32, 4),
        ir.transforms.training(models.mlp(8, 16, 32, 4)),
        ir.transforms.parallelize(models.mlp(8, 16, 32, 4), dp=2),
    ):
        texts.append(ir.format(f))
    return texts


# -- text mutations --------------------------------------------------------------------


def _char(rng: random.Random, text: str) -> str:
    i = rng.randrange(len(text) + 1)
    c = rng.choice([rng.choice(NON_ASCII), chr(rng.randrange(32, 127)), ""])
    return text[:i] + c + text[i + rng.choice([0, 1]) :]


def _token(rng: random.Random, text: str) -> str:
    tokens = re.findall(r"\w+|[^\w\s]|\s+", text)
    i = rng.randrange(len(tokens))
    kind = rng.randrange(3)
    if kind == 0:
        del tokens[i]
    elif kind == 1:
        tokens.insert(i, tokens[rng.randrange(len(tokens))])
    else:
        tokens[i], tokens[-1 - i] = tokens[-1 - i], tokens[i]
    return "".join(tokens)


def _line(rng: random.Random, text: str) -> str:
    lines = text.split("\n")
    i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
    kind = rng.randrange(3)
    if kind == 0:
        del lines[i]
    elif kind == 1:
        lines.insert(i, lines[j])
    else:
        lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines)


def _number(rng: random.Random, text: str) -> str:
    spots = [m.span() for m in re.finditer(r"\d+", text)]
    if not spots:
        return text
    a, b = rng.choice(spots)
    return text[:a] + rng.choice(NUMBERS) + text[b:]


def _depth(rng: random.Random, text: str) -> str:
    i = rng.randrange(len(text) + 1)
    n = rng.choice([10, 99, 101, 500, 5000])
    opener, closer = rng.choice([("(", ")"), ("[", "]"), ("Tuple[", "]"), ("{", "}")])
    return text[:i] + opener * n + closer * rng.choice([0, n]) + text[i:]


MUTATIONS = (_char, _token, _line, _number, _depth)


def text_input(rng: random.Random, texts: list[str]) -> str:
    text = rng.choice(texts)
    for _ in range(rng.choice([1, 1, 2, 3, 8])):
        text = rng.choice(MUTATIONS)(rng, text)
    return text


def run_text(text: str) -> None:
    f = ir.parse(text)
    devices = sorted(d for d in f.devices if isinstance(d, int))
    if devices and all(d < 4096 for d in devices):
        ir.simulate(f, ir.Topology.uniform(devices[-1] + 1))


# -- API arguments -----------------------------------------------------------------------


def api_calls() -> list[tuple[str, Callable[[Any], Any]]]:
    from workbench import Session, Strategy

    mlp = models.mlp(8, 16, 32, 4)
    topology = ir.Topology.uniform(4)
    session = Session(mlp, topology)
    inputs = ir.random_inputs(mlp)

    uniform, parallelize = ir.Topology.uniform, ir.transforms.parallelize

    def annotate(v: Any) -> None:
        if session.annotate("wA", v):
            session.undo()

    return [
        ("ir.parse(v)", lambda v: ir.parse(v)),
        ("ir.execute(f, v)", lambda v: ir.execute(mlp, v)),
        ("ir.execute(v, inputs)", lambda v: ir.execute(v, inputs)),
        ("ir.simulate(f, v)", lambda v: ir.simulate(mlp, v)),
        ("ir.simulate(f, t, combine=v)", lambda v: ir.simulate(mlp, topology, combine=v)),
        ("ir.random_inputs(f, v)", lambda v: ir.random_inputs(mlp, v)),
        ("Topology.uniform(v)", lambda v: ir.Topology.uniform(v)),
        ("Topology.uniform(4, link_latency_s=v)", lambda v: uniform(4, link_latency_s=v)),
        ("Topology.preset(v, 4)", lambda v: ir.Topology.preset(v, 4)),
        ("Topology.preset('a100-hgx', v)", lambda v: ir.Topology.preset("a100-hgx", v)),
        ("parallelize(f, dp=v)", lambda v: ir.transforms.parallelize(mlp, dp=v)),
        ("parallelize(f, pp=2, microbatches=v)", lambda v: parallelize(mlp, pp=2, microbatches=v)),
        ("TensorType(v)", lambda v: ir.TensorType(v)),
        ("TensorType((2,), v)", lambda v: ir.TensorType((2,), v)),
        ("Mesh(v)", lambda v: Mesh(v)),
        ("placement(v)", lambda v: placement(v)),
        ("ShardingSpec(v)", lambda v: ShardingSpec(v)),
        ("Strategy(dp=v)", lambda v: Strategy(dp=v)),
        ("Strategy.parse(v)", lambda v: Strategy.parse(v)),
        ("Session.load(v)", lambda v: Session.load(v)),
        ("models.mlp(8, 4, 6, 4, dtype=v)", lambda v: models.mlp(8, 4, 6, 4, dtype=v)),
        ("models.gpt(..., dtype=v)", lambda v: models.gpt(2, 4, 8, 1, 16, 1, dtype=v)),
        ("ir.random_inputs(f, max_bytes=v)", lambda v: ir.random_inputs(mlp, max_bytes=v)),
        ("Mesh((2,), v)", lambda v: Mesh((2,), v)),
        ("ShardingSpec([0, 1], [(0, 2)], v)", lambda v: ShardingSpec([0, 1], [(0, 2)], v)),
        ("Session.set_strategy(v)", lambda v: session.set_strategy(v) and session.undo()),
        ("Session.annotate('wA', v)", annotate),
        ("Session.annotate(v, spec)", lambda v: session.annotate(v, (Mesh((4,)), ["S(1)"]))),
    ]  # fmt: skip


def api_input(rng: random.Random, calls: list) -> tuple[str, Callable[[], Any], str]:
    name, call = rng.choice(calls)
    value = rng.choice(WRONG)
    return name, (lambda: call(value)), f"{name} with v={_short(repr(value))}"


# -- the loop ----------------------------------------------------------------------------


def _short(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


TARGETS = ("text", "api", "transforms", "inputs", "programs", "sessions", "ops")
OUTCOMES = (
    "ok", "project error", "unlocated error", "wrong output", "other exception", "timeout",
)  # fmt: skip
BAD = ("unlocated error", "wrong output", "other exception", "timeout")


def _drawer(what: str) -> Callable[[random.Random], tuple[Callable[[], Any], str, Any]]:
    """For target ``what``: a function drawing (the call, how it is shown, a check of
    a project error's message or None)."""
    if what == "text":
        texts = corpus()

        def text(rng: random.Random) -> tuple[Callable[[], Any], str, Any]:
            t = text_input(rng, texts)
            return (lambda: run_text(t)), repr(t), None

        return text
    if what == "api":
        calls = api_calls()

        def api(rng: random.Random) -> tuple[Callable[[], Any], str, Any]:
            _, run, shown = api_input(rng, calls)
            return run, shown, None

        return api
    if what == "transforms":
        entries = fuzz_transforms.transform_calls()

        def transform(rng: random.Random) -> tuple[Callable[[], Any], str, Any]:
            name, param, call = rng.choice(entries)
            value = rng.choice(fuzz_transforms.VALUES)
            shown = f"{name} with v={_short(fuzz_transforms.shown(value))}"
            return (lambda: call(value)), shown, (param, value)

        return transform
    if what == "inputs":
        programs = fuzz_transforms.Programs()

        def inputs(rng: random.Random) -> tuple[Callable[[], Any], str, Any]:
            shown, run = fuzz_transforms.input_case(rng, programs)
            return run, shown, None

        return inputs
    if what == "programs":

        def programs_(rng: random.Random) -> tuple[Callable[[], Any], str, Any]:
            shown, run = fuzz_programs.program_case(rng)
            return run, shown, None

        return programs_
    if what == "ops":

        def ops(rng: random.Random) -> tuple[Callable[[], Any], str, Any]:
            shown, run = fuzz_ops.op_case(rng)
            return run, shown, None

        return ops
    if what == "sessions":
        case = fuzz_sessions.SessionCase()

        def sessions(rng: random.Random) -> tuple[Callable[[], Any], str, Any]:
            shown, run = fuzz_sessions.session_case(rng, case)
            return run, shown, None

        return sessions
    raise SystemExit(f"unknown target {what!r}: use some of {', '.join(TARGETS)}")


def fuzz(what: str, count: int, seed: int, timeout_s: float) -> tuple[Counter, dict]:
    """Run ``count`` inputs of target ``what``; outcome counts and examples of bugs."""
    rng = random.Random(f"{seed}-{what}")
    outcomes: Counter = Counter()
    examples: dict[str, list[str]] = defaultdict(list)
    draw = _drawer(what)
    signal.signal(signal.SIGALRM, _alarm)
    for _ in range(count):
        run, shown, located = draw(rng)
        kind = ""
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            try:
                run()
            finally:  # off before any handler runs: the alarm must not hit one
                signal.setitimer(signal.ITIMER_REAL, 0)
            outcome = "ok"
        except InputTimeoutError:
            outcome = kind = "timeout"
        except DistIRError as e:
            outcome = "project error"
            if located is not None and not fuzz_transforms.located(str(e), *located):
                outcome = "unlocated error"
                kind = f"unlocated: {_short(str(e), 80)}"
        except fuzz_sessions.UnlocatedError as e:
            outcome, kind = "unlocated error", f"unlocated: {_short(str(e), 80)}"
        except fuzz_transforms.WrongOutputError as e:
            outcome, kind = "wrong output", f"wrong output: {_short(str(e), 80)}"
        except Exception as e:
            outcome = "other exception"
            kind = f"{type(e).__name__}: {_short(str(e), 80)}"
        outcomes[outcome] += 1
        if kind and len(examples[kind]) < 3:
            examples[kind].append(_short(shown, 300))
    return outcomes, dict(examples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=10_000, help="inputs per target")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=5.0, help="time limit per input")
    parser.add_argument("--what", default=",".join(TARGETS), help="comma-separated targets")
    args = parser.parse_args(argv)
    bad = 0
    for what in args.what.split(","):
        start = time.perf_counter()
        outcomes, examples = fuzz(what, args.count, args.seed, args.timeout_s)
        took = time.perf_counter() - start
        print(f"{what}: {args.count} inputs in {took:.1f} s (seed {args.seed})")
        for outcome in OUTCOMES:
            print(f"  {outcome:16} {outcomes[outcome]:8}")
        for kind, shown in examples.items():
            print(f"  - {kind}")
            for s in shown:
                print(f"      {s}")
        bad += sum(outcomes[o] for o in BAD)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
