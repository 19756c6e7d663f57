"""The *programs* target of ``benchmarks/fuzz.py``: valid programs through transforms,
proven by execution and simulation.

A valid program (MLPs and GPTs of drawn sizes, layers and activations, the golden
texts; forward or a training step, some returning their gradients; some rebuilt with
their outputs shuffled, dropped, repeated or joined by an intermediate value) is put
through a transform with drawn parameters, mostly in range. When the transform
accepts, its result is executed on random inputs and compared with the sequential
program (``ir.execute_step``), then simulated wherever the source simulates: a
difference, a failure to run or to simulate is a *wrong output*. In two cases of
five the result goes through a second drawn transform instead (a transform of an
already-parallel program): a project error, or a program that runs and, where it
keeps its input's signature, computes what its input computes.
"""

from __future__ import annotations

import contextlib
import random
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from fuzz_transforms import GOLDEN, WrongOutputError

import ir
from ir import models
from ir import transforms as tfm
from ir.builder import rebuild_op
from ir.sharding import Mesh, propagate


def _program(rng: random.Random) -> ir.Function:
    kind = rng.randrange(6)
    if kind <= 2:
        f = models.mlp(
            rng.choice([2, 4, 6, 8]),
            rng.choice([2, 4, 6]),
            rng.choice([4, 6, 8]),
            rng.choice([2, 3, 4]),
            layers=rng.choice([1, 2, 3, 4]),
            activation=rng.choice(["relu", "gelu", None]),
        )
    elif kind == 3:
        f = models.gpt(
            rng.choice([2, 4]),
            rng.choice([2, 4]),
            8,
            rng.choice([1, 2]),
            16,
            1,
            attention=rng.choice(["fused", "unfused"]),
        )
    else:
        f = ir.parse(rng.choice(sorted(GOLDEN.glob("*.txt"))).read_text())
    if rng.random() < 0.3:
        f = _mutated_program(rng, f)
    if rng.random() < 0.6:
        with contextlib.suppress(ir.DistIRError):  # a golden program without a scalar loss
            f = tfm.training(f, rng.choice(["sgd", "adam"]), return_gradients=rng.random() < 0.3)
    return f


def _mutated_program(rng: random.Random, f: ir.Function) -> ir.Function:
    """``f`` rebuilt with its outputs shuffled, one dropped, repeated or joined by an
    intermediate value, and maybe an unused input: another valid program (or ``f``
    where the result would not verify)."""
    b = ir.FunctionBuilder(f.name)
    env = {v: b.input(v.name, v.type) for v in f.inputs}
    if rng.random() < 0.3:
        b.input("unused", ir.TensorType((3,), device=0))
    for op in f.ops:
        env.update(zip(op.outputs, rebuild_op(b, op, [env[v] for v in op.inputs])))
    outputs = [env[v] for v in f.outputs]
    kind = rng.randrange(4)
    if kind == 0:
        rng.shuffle(outputs)
    elif kind == 1 and len(outputs) > 1:
        outputs.pop(rng.randrange(len(outputs)))
    elif kind == 2:
        outputs.append(rng.choice(outputs))
    elif f.ops:
        inner = [v for op in f.ops for v in op.outputs if v not in f.outputs]
        if inner:
            outputs.insert(rng.randrange(len(outputs) + 1), env[rng.choice(inner)])
    try:
        return b.finish(outputs)
    except ir.DistIRError:
        return f


def _degree(rng: random.Random) -> Any:
    if rng.random() < 0.85:
        return rng.choice([1, 1, 2, 2, 3, 4])
    return rng.choice([5, 8, 0, -1, 2.0, True, None, 2**16, 2**70])


def _transform(rng: random.Random, f: ir.Function) -> tuple[str, Callable[[], ir.Function]]:
    d = _degree
    names = [v.name for v in f.inputs] + [v.name for op in f.ops for v in op.outputs]
    schedules = ["gpipe", "1f1b", "interleaved"]
    kind = rng.randrange(12)
    n = d(rng)
    if kind == 0:
        how = rng.choice(["resident", "resident", "distribute"])
        return "data_parallel", lambda: tfm.data_parallel(f, n, inputs=how)
    if kind == 1:
        return "horizontal_parallel", lambda: tfm.horizontal_parallel(f, n)
    schedule = rng.choice(schedules)
    chunks = rng.choice([1, 2]) if schedule == "interleaved" or rng.random() < 0.1 else 1
    if kind == 2:
        args = (n, d(rng), schedule)
        return "pipeline_parallel", lambda: tfm.pipeline_parallel(f, *args, chunks=chunks)
    if kind == 3:  # degrees mostly 1-2 and microbatches a multiple of pp: most apply
        small = [rng.choice([1, 1, 2]) if rng.random() < 0.9 else d(rng) for _ in range(3)]
        pp = small[2] if small[2] in (1, 2, 3, 4) and not isinstance(small[2], bool) else 1
        microbatches = pp * rng.choice([1, 2]) if rng.random() < 0.9 else d(rng)
        args = (*small, microbatches, schedule)
        opts = {
            "chunks": chunks,
            "zero": rng.choice([0, 0, 1, 2]),
            "sequence_parallel": rng.random() < 0.3,
        }
        return "megatron", lambda: tfm.megatron(f, *args, **opts)
    if kind == 4:
        args = (d(rng), d(rng), rng.choice([1, 2]))
        return "gradient_accumulation", lambda: tfm.gradient_accumulation(
            f, args[0], dp=args[1], tp=args[2]
        )
    if kind == 5:
        return "recompute", lambda: tfm.recompute(f)
    if kind == 6:
        assignment = {rng.choice(names): rng.randrange(4) for _ in range(rng.randrange(1, 4))}
        return "place", lambda: tfm.place(f, assignment)
    if kind == 7:
        levels = [(rng.choice(["dp", "hp", "pp"]), d(rng)) for _ in range(rng.choice([1, 2, 3]))]
        microbatches = d(rng)
        return "nested", lambda: tfm.nested(f, *levels, microbatches=microbatches)
    if kind == 8:
        return "unroll_pmap", lambda: tfm.unroll_pmap(tfm.data_parallel(f, n))
    if kind == 9:
        mesh = Mesh(rng.choice([(2,), (4,), (2, 2), (3,), (2, 2, 2)]))
        choices = ["S(0)", "S(1)", "R", "P(sum)", "S(2)", "S(-1)"]
        anns = {
            rng.choice(names): (mesh, [rng.choice(choices) for _ in range(mesh.ndim)])
            for _ in range(rng.randrange(1, 4))
        }
        how = rng.choice(["resident", "distribute"])
        return "propagate", lambda: propagate(f, anns, inputs=how)[0]
    if kind == 10:
        return "data_then_horizontal", lambda: tfm.data_then_horizontal(f, n)
    return "horizontal_then_data", lambda: tfm.horizontal_then_data(f, n)


def program_case(rng: random.Random) -> tuple[str, Callable[[], None]]:
    """A drawn program and transform, and in two cases of five a second transform of
    the first's result: (what it is, a call that raises on a bad outcome)."""
    f = _program(rng)
    name, apply = _transform(rng, f)
    again = random.Random(rng.random()) if rng.random() < 0.4 else None

    def run() -> None:
        g = apply()
        if again is not None:
            _transformed_again(g, again, f"{name} on {f.name}")
            return
        inputs = ir.random_inputs(f)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # overflow in a random GPT is not the question
            want = ir.execute(f, inputs)
            steady = g.input_layouts or [v.name for v in g.inputs] == [v.name for v in f.inputs]
            try:
                got = ir.execute_step(g, inputs, f) if steady else ir.execute(g, inputs)
            except ir.DistIRError as e:  # accepted, then fails: as wrong as a wrong number
                raise WrongOutputError(f"{name} on {f.name}: the result does not run: {e}") from e
        if len(got) != len(want):
            raise WrongOutputError(f"{name}: {len(got)} outputs for {len(want)}")
        for i, (a, b) in enumerate(zip(got, want)):
            if np.shape(a) != np.shape(b) or not np.allclose(
                a, b, rtol=1e-4, atol=1e-5, equal_nan=True
            ):
                raise WrongOutputError(f"{name} on {f.name}: output {i} differs")
        _simulates_like(f, g, f"{name} on {f.name}", options)

    options = {
        "combine": rng.choice(["roofline", "additive"]),
        "comm": rng.choice(["channels", "serial"]),
        "symmetry": rng.random() < 0.5,
    }
    return f"{name} on {f.name}", run


def _transformed_again(g: ir.Function, rng: random.Random, first: str) -> None:
    """A drawn transform of ``g`` (already transformed): refused with a project error,
    or a program that runs, and computes what ``g`` computes where it takes ``g``'s
    inputs and gives its outputs (recompute, place, unroll_pmap of a distributed
    program)."""
    name, apply = _transform(rng, g)
    what = f"{name} of ({first})"
    h = apply()
    xs = ir.random_inputs(g)
    same_inputs = [v.type for v in h.inputs] == [v.type for v in g.inputs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            got = ir.execute(h, xs if same_inputs else ir.random_inputs(h))
        except ir.DistIRError as e:
            raise WrongOutputError(f"{what}: the result does not run: {e}") from e
        if not same_inputs or [v.type for v in h.outputs] != [v.type for v in g.outputs]:
            return
        want = ir.execute(g, xs)
    for i, (a, b) in enumerate(zip(_flat(got), _flat(want))):
        if not np.allclose(a, b, rtol=1e-4, atol=1e-5, equal_nan=True):
            raise WrongOutputError(f"{what}: output {i} differs from its input program's")


def _flat(values: Any) -> list:
    out: list = []
    for v in values:
        out += _flat(v) if isinstance(v, tuple) else [np.asarray(v)]
    return out


def _simulates_like(f: ir.Function, g: ir.Function, what: str, options: dict) -> None:
    """``g`` simulates (a non-negative step time) on a uniform topology over its devices
    wherever its source ``f`` does."""
    ids = [d for d in (*f.devices, *g.devices) if isinstance(d, int)]
    topology = ir.Topology.uniform(max(ids, default=0) + 1)
    try:
        ir.simulate(f, topology, **options)
    except ir.DistIRError:
        return  # the source itself cannot be simulated (a device left unassigned, say)
    try:
        step_time_s = ir.simulate(g, topology, **options).step_time_s
    except ir.DistIRError as e:
        raise WrongOutputError(f"{what}: the source simulates, the result does not: {e}") from e
    if not step_time_s >= 0:
        raise WrongOutputError(f"{what}: simulated step time {step_time_s}")
