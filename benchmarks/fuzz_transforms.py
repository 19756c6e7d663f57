"""The *transforms* and *inputs* targets of ``benchmarks/fuzz.py``.

*transforms*: the public transforms (``ir.transforms``), ``ir.sharding.propagate``,
``ir.execute`` / ``execute_step`` / ``distribute`` / ``collect`` and ``ir.simulate``,
each called with one argument replaced by a value of a wrong type or range. Each call
names the parameter it replaces: a project error must name it or the value.

*inputs*: valid sequential and distributed programs run on inputs mutated in count,
shape, dtype, nesting, values (NaN, inf, negative labels, fractions) and size (a
broadcast view of 10^13 elements, which costs nothing until copied).

*programs* is in ``benchmarks/fuzz_programs.py``.
"""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import ir
from ir import models
from ir import transforms as tfm
from ir.sharding import Mesh, propagate

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "ir" / "golden"

# values that are wrong for most parameters; some are right for some (3 devices, "gpipe")
VALUES = [
    None, True, False, -1, 0, 3, 7, 2**16, 2**70, -(2**70), 1.5, 2.0, -0.0, math.nan,
    math.inf, "", "x", "gpipe", "1f1b", "dp=2", b"x", [], {}, (), (1, 2), [-1], [0, 0],
    ["a", "b"], {"a": 1}, {"wA": "x"}, ("dp", 2), [("dp", 2)], object(), np.float32(2),
    np.int64(2), np.array([1, 2]), np.bool_(True), 10**4000, lambda *a: 1,
]  # fmt: skip


class WrongOutputError(AssertionError):
    """A transform accepted its input and its result computes something else."""


class Calls:
    """The fixtures the calls share, built once."""

    def __init__(self) -> None:
        self.f = models.mlp(8, 16, 32, 4)
        self.t = tfm.training(self.f)
        self.topology = ir.Topology.uniform(4)
        self.inputs = ir.random_inputs(self.f)
        self.dp = tfm.data_parallel(self.f, 2)
        self.ann = {"x": (Mesh((2,)), ["S(0)"])}
        self.step, _ = propagate(self.f, self.ann)
        self.outs = list(ir.execute(self.step, ir.distribute(self.step, self.inputs, self.f)))
        self.pipe = tfm.parallelize(self.t, pp=2, microbatches=2)


def transform_calls() -> list[tuple[str, str, Callable[[Any], Any]]]:
    """(shown call, the parameter ``v`` replaces, the call) for every entry point."""
    c = Calls()
    f, t, topo, x, step, ann = c.f, c.t, c.topology, c.inputs, c.step, c.ann
    m2 = Mesh((2,))
    return [
        ("training(v)", "f", lambda v: tfm.training(v)),
        ("training(f, optimizer=v)", "optimizer", lambda v: tfm.training(f, v)),
        ("training(f, lr=v)", "lr", lambda v: tfm.training(f, lr=v)),
        ("training(f, params=v)", "params", lambda v: tfm.training(f, params=v)),
        ("training(f, loss=v)", "loss", lambda v: tfm.training(f, loss=v)),
        ("training(f, return_gradients=v)", "return_gradients",
         lambda v: tfm.training(f, return_gradients=v)),
        ("gradients(f, v)", "params", lambda v: tfm.gradients(f, v)),
        ("data_parallel(v, 2)", "f", lambda v: tfm.data_parallel(v, 2)),
        ("data_parallel(f, v)", "degree", lambda v: tfm.data_parallel(f, v)),
        ("data_parallel(f, 2, v)", "devices", lambda v: tfm.data_parallel(f, 2, v)),
        ("data_parallel(f, 2, batch_inputs=v)", "batch_inputs",
         lambda v: tfm.data_parallel(f, 2, batch_inputs=v)),
        ("data_parallel(f, 2, topology=v)", "topology",
         lambda v: tfm.data_parallel(f, 2, topology=v)),
        ("data_parallel(f, 2, inputs=v)", "inputs", lambda v: tfm.data_parallel(f, 2, inputs=v)),
        ("data_parallel(f, 2, replicated=v)", "replicated",
         lambda v: tfm.data_parallel(f, 2, replicated=v)),
        ("data_parallel(f, 2, output_device=v)", "output_device",
         lambda v: tfm.data_parallel(f, 2, output_device=v)),
        ("data_parallel(f, 2, var=v)", "var", lambda v: tfm.data_parallel(f, 2, var=v)),
        ("data_parallel(f, 2, device_map=v)", "device_map",
         lambda v: tfm.data_parallel(f, 2, device_map=v)),
        ("data_parallel(f, 2, inner=v)", "inner", lambda v: tfm.data_parallel(f, 2, inner=v)),
        ("horizontal_parallel(f, v)", "degree", lambda v: tfm.horizontal_parallel(f, v)),
        ("horizontal_parallel(f, 2, v)", "devices", lambda v: tfm.horizontal_parallel(f, 2, v)),
        ("horizontal_parallel(f, 2, topology=v)", "topology",
         lambda v: tfm.horizontal_parallel(f, 2, topology=v)),
        ("pipeline_parallel(t, v, 2)", "stages", lambda v: tfm.pipeline_parallel(t, v, 2)),
        ("pipeline_parallel(t, 2, v)", "microbatches", lambda v: tfm.pipeline_parallel(t, 2, v)),
        ("pipeline_parallel(t, 2, 2, v)", "schedule", lambda v: tfm.pipeline_parallel(t, 2, 2, v)),
        ("pipeline_parallel(t, 2, 2, chunks=v)", "chunks",
         lambda v: tfm.pipeline_parallel(t, 2, 2, chunks=v)),
        ("pipeline_parallel(t, 2, 2, resident=v)", "resident",
         lambda v: tfm.pipeline_parallel(t, 2, 2, resident=v)),
        ("pipeline_parallel(t, 2, 2, output_device=v)", "output_device",
         lambda v: tfm.pipeline_parallel(t, 2, 2, output_device=v)),
        ("pipeline_parallel(t, 2, 2, stage_of=v)", "stage",
         lambda v: tfm.pipeline_parallel(t, 2, 2, stage_of=v)),
        ("megatron(v)", "f", lambda v: tfm.megatron(v)),
        ("megatron(t, dp=v)", "dp", lambda v: tfm.megatron(t, dp=v)),
        ("megatron(t, tp=v)", "tp", lambda v: tfm.megatron(t, tp=v)),
        ("megatron(t, pp=v, microbatches=2)", "pp",
         lambda v: tfm.megatron(t, pp=v, microbatches=2)),
        ("megatron(t, pp=2, microbatches=v)", "microbatches",
         lambda v: tfm.megatron(t, pp=2, microbatches=v)),
        ("megatron(t, pp=2, microbatches=2, schedule=v)", "schedule",
         lambda v: tfm.megatron(t, pp=2, microbatches=2, schedule=v)),
        ("megatron(t, dp=2, zero=v)", "zero", lambda v: tfm.megatron(t, dp=2, zero=v)),
        ("megatron(t, tp=2, sequence_parallel=v)", "sequence_parallel",
         lambda v: tfm.megatron(t, tp=2, sequence_parallel=v)),
        ("megatron(t, dp=2, devices=v)", "devices", lambda v: tfm.megatron(t, dp=2, devices=v)),
        ("megatron(t, dp=2, topology=v)", "topology", lambda v: tfm.megatron(t, dp=2, topology=v)),
        ("parallelize(t, hp=v)", "hp", lambda v: tfm.parallelize(t, hp=v)),
        ("gradient_accumulation(t, v)", "steps", lambda v: tfm.gradient_accumulation(t, v)),
        ("gradient_accumulation(t, 2, dp=v)", "dp",
         lambda v: tfm.gradient_accumulation(t, 2, dp=v)),
        ("recompute(v)", "f", lambda v: tfm.recompute(v)),
        ("recompute(t, v)", "values", lambda v: tfm.recompute(t, v)),
        ("place(f, v)", "assignment", lambda v: tfm.place(f, v)),
        ("place(f, {'a': v})", "assignment", lambda v: tfm.place(f, {"a": v})),
        ("place(f, {'a': 1}, topology=v)", "topology",
         lambda v: tfm.place(f, {"a": 1}, topology=v)),
        ("nested(t, v)", "level", lambda v: tfm.nested(t, v)),
        ("nested(t, ('dp', 2), ('hp', v))", "hp", lambda v: tfm.nested(t, ("dp", 2), ("hp", v))),
        ("nested(t, (v, 2))", "parallelism", lambda v: tfm.nested(t, (v, 2))),
        ("nested(t, ('pp', 2), microbatches=v)", "microbatches",
         lambda v: tfm.nested(t, ("pp", 2), microbatches=v)),
        ("data_then_horizontal(f, 2, split_at=v)", "split_at",
         lambda v: tfm.data_then_horizontal(f, 2, split_at=v)),
        ("horizontal_then_data(f, v)", "degree", lambda v: tfm.horizontal_then_data(f, v)),
        ("unroll_pmap(v)", "f", lambda v: tfm.unroll_pmap(v)),
        ("device_programs(v)", "f", lambda v: tfm.device_programs(v)),
        ("setup_program(f, v)", "step", lambda v: tfm.setup_program(f, v)),
        ("stage_assignment(t, 2, v)", "stage", lambda v: tfm.stage_assignment(t, 2, v)),
        ("live_microbatches(v, 0)", "g", lambda v: tfm.live_microbatches(v, 0)),
        ("live_microbatches(g, v)", "device", lambda v: tfm.live_microbatches(c.pipe, v)),
        ("peak_live_bytes(v)", "f", lambda v: tfm.peak_live_bytes(v)),
        ("propagate(v, ann)", "function", lambda v: propagate(v, ann)),
        ("propagate(f, v)", "annotations", lambda v: propagate(f, v)),
        ("propagate(f, {'x': v})", "annotation", lambda v: propagate(f, {"x": v})),
        ("propagate(f, {'x': (v, ['S(0)'])})", "mesh",
         lambda v: propagate(f, {"x": (v, ["S(0)"])})),
        ("propagate(f, {'x': (mesh, v)})", "placements", lambda v: propagate(f, {"x": (m2, v)})),
        ("propagate(f, {'x': (mesh, [v])})", "placement", lambda v: propagate(f, {"x": (m2, [v])})),
        ("propagate(f, ann, v)", "topology", lambda v: propagate(f, ann, v)),
        ("propagate(f, None, mesh=v)", "mesh", lambda v: propagate(f, None, mesh=v)),
        ("propagate(f, ann, inputs=v)", "inputs", lambda v: propagate(f, ann, inputs=v)),
        ("propagate(t, {'wA': (Mesh(v), ['S(1)'])})", "mesh shape",
         lambda v: propagate(t, {"wA": (Mesh(v), ["S(1)"])})),
        ("execute(f, v)", "inputs", lambda v: ir.execute(f, v)),
        ("execute(f, [v, ...])", "wA", lambda v: ir.execute(f, [v, *x[1:]])),
        ("execute(dp, v)", "inputs", lambda v: ir.execute(c.dp, v)),
        ("execute_step(v, inputs)", "step", lambda v: ir.execute_step(v, x)),
        ("execute_step(step, v, f)", "inputs", lambda v: ir.execute_step(step, v, f)),
        ("execute_step(step, [v, ...], f)", "wA", lambda v: ir.execute_step(step, [v, *x[1:]], f)),
        ("execute_step(step, inputs, v)", "source", lambda v: ir.execute_step(step, x, v)),
        ("execute_step(step, inputs, f, rtol=v)", "rtol",
         lambda v: ir.execute_step(step, x, f, rtol=v)),
        ("distribute(v, inputs, f)", "step", lambda v: ir.distribute(v, x, f)),
        ("distribute(step, v, f)", "inputs", lambda v: ir.distribute(step, v, f)),
        ("distribute(step, [.., v, ..], f)", "x",
         lambda v: ir.distribute(step, [*x[:2], v, x[3]], f)),
        ("collect(v, outs)", "step", lambda v: ir.collect(v, c.outs)),
        ("collect(step, v)", "outputs", lambda v: ir.collect(step, v)),
        ("collect(step, [v, outs[1]])", "y", lambda v: ir.collect(step, [v, c.outs[1]])),
        ("collect(step, outs, v)", "rtol", lambda v: ir.collect(step, c.outs, v)),
        ("simulate(v, topology)", "function", lambda v: ir.simulate(v, topo)),
        ("simulate(f, v)", "topology", lambda v: ir.simulate(f, v)),
        ("simulate(f, t, combine=v)", "combine", lambda v: ir.simulate(f, topo, combine=v)),
        ("simulate(f, t, comm=v)", "comm", lambda v: ir.simulate(f, topo, comm=v)),
        ("simulate(step, t, symmetry=v)", "symmetry",
         lambda v: ir.simulate(step, topo, symmetry=v)),
    ]  # fmt: skip


def shown(value: Any) -> str:
    """``repr(value)``, or a description of an int too long for Python to print."""
    try:
        return repr(value)
    except ValueError:
        return f"<an integer of {value.bit_length()} bits>"


def located(message: str, parameter: str, value: Any) -> bool:
    """The error message names the parameter (or its singular) or shows the value or,
    for a list or dict, one of its items or keys."""
    text = message.lower()
    if parameter.lower() in text or parameter.lower().rstrip("s") in text:
        return True
    parts = [value]
    if isinstance(value, (list, tuple, dict, np.ndarray)):
        parts += list(value)
    for part in parts:
        try:
            shown = [repr(part)[:12], str(part)[:12]]
        except ValueError:  # an int past Python's digit limit: no message can show it
            shown = ["integer"]
        if any(s.lower() in text for s in shown):
            return True
    return False


# -- mutated inputs ----------------------------------------------------------------------


def _mutated_array(rng: random.Random, x: Any) -> Any:
    try:
        x = np.asarray(x)
    except ValueError:  # pieces of different shapes: nest them one level deeper
        return [x]
    if x.size > 10**6:  # the huge view drawn before: copying it is not the question
        return x
    kind = rng.randrange(20)
    mutations: list[Callable[[], Any]] = [
        lambda: x.T if x.ndim >= 2 else x[None],
        lambda: x[..., None],
        lambda: x.reshape(-1),
        lambda: np.zeros((0, *x.shape[1:]), x.dtype),
        lambda: x.astype(np.complex64),
        lambda: x.astype(object),
        lambda: x.astype(str),
        lambda: x.astype(np.float64) + 0.5,
        lambda: np.where(np.arange(x.size).reshape(x.shape) == 0, math.nan, x),
        lambda: np.where(np.arange(x.size).reshape(x.shape) == 0, math.inf, x),
        lambda: -np.abs(x) - 1,
        lambda: np.broadcast_to(np.float32(0), (10**6, 10**7)),
        lambda: (x, x),
        lambda: [x],
        lambda: x.tolist(),
        lambda: None,
        lambda: x.astype(bool),
        lambda: np.full(x.shape, 1e300),
        lambda: [[1, 2], [3]],
        lambda: x * 1e39,
    ]
    try:
        return mutations[kind]()
    except (ValueError, TypeError, MemoryError):  # a mutation of an earlier mutation
        return x


def _mutated(rng: random.Random, x: Any) -> Any:
    if isinstance(x, tuple):
        if not x:  # emptied by an earlier mutation
            return (np.zeros(1),)
        kind = rng.randrange(4)
        if kind == 0:
            return x[:-1]
        if kind == 1:
            return (*x, x[0])
        if kind == 2:
            return x[0]
        i = rng.randrange(len(x))
        return (*x[:i], _mutated(rng, x[i]), *x[i + 1 :])
    return _mutated_array(rng, x)


def mutated_inputs(rng: random.Random, inputs: list[Any]) -> list[Any]:
    """``inputs`` with one or two mutated, or one dropped or repeated."""
    inputs = list(inputs)
    kind = rng.randrange(6)
    if kind == 0:
        inputs.pop(rng.randrange(len(inputs)))
    elif kind == 1:
        inputs.append(inputs[0])
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # casts to int of NaN, say: the point of the input
            for _ in range(rng.choice([1, 1, 2])):
                i = rng.randrange(len(inputs))
                inputs[i] = _mutated(rng, inputs[i])
    return inputs


class Programs:
    """Sequential programs and distributed steps of them, with their inputs."""

    def __init__(self) -> None:
        mlp = models.mlp(8, 16, 32, 4)
        t = tfm.training(mlp)
        self.plain = {
            "mlp": mlp,
            "adam": tfm.training(mlp, "adam"),
            "gpt": models.gpt(2, 4, 8, 2, 16, 1),
            "gpt (unfused)": models.gpt(2, 4, 8, 2, 16, 1, attention="unfused"),
            "dp (distribute)": tfm.data_parallel(mlp, 2, inputs="distribute"),
            "nested dp x hp": tfm.nested(t, ("dp", 2), ("hp", 2)),
        }
        self.steps = {
            "dp": (tfm.data_parallel(mlp, 2), mlp),
            "hp": (tfm.horizontal_parallel(mlp, 2), mlp),
            "pp": (tfm.pipeline_parallel(t, 2, 2), t),
            "megatron": (tfm.megatron(t, dp=2, tp=2), t),
            "propagated": (propagate(mlp, {"x": (Mesh((2,)), ["S(0)"])})[0], mlp),
        }
        self.inputs = {n: ir.random_inputs(f) for n, f in self.plain.items()}
        self.seq_inputs = {n: ir.random_inputs(src) for n, (_, src) in self.steps.items()}


def input_case(rng: random.Random, p: Programs) -> tuple[str, Callable[[], Any]]:
    """One executor call on mutated inputs: (what it is, the call)."""
    if rng.random() < 0.4:
        name = rng.choice(list(p.plain))
        f, xs = p.plain[name], mutated_inputs(rng, p.inputs[name])
        return f"execute({name})", _quiet(lambda: ir.execute(f, xs))
    name = rng.choice(list(p.steps))
    step, source = p.steps[name]
    how = rng.choice(["execute_step", "distribute", "collect"])
    if how == "collect":
        outs = ir.execute(step, ir.distribute(step, p.seq_inputs[name], source))
        ys = mutated_inputs(rng, list(outs))
        return f"collect({name})", _quiet(lambda: ir.collect(step, ys))
    xs = mutated_inputs(rng, p.seq_inputs[name])
    call = ir.execute_step if how == "execute_step" else ir.distribute
    return f"{how}({name})", _quiet(lambda: call(step, xs, source))


def _quiet(call: Callable[[], Any]) -> Callable[[], Any]:
    """``call`` without numpy's warnings: NaN and inf inputs are fed on purpose."""

    def run() -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return call()

    return run
