"""benchmarks/fuzz.py in small: mutated programs, wrong API arguments, mutated executor
inputs, transformed (and transformed again) programs, session files with hostile fields
and paths, and one-op programs on unusual operands give only project errors (located,
for the transforms' arguments and the session fields), within a time bound, and
transforms that accept compute what their source does; and the API bugs its first run
found stay fixed."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import random
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ir
from ir import models
from ir.sharding import Mesh, ShardingSpec
from workbench import Session

_SPEC = importlib.util.spec_from_file_location(
    "fuzz", Path(__file__).resolve().parents[1] / "benchmarks" / "fuzz.py"
)
fuzz = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(fuzz)
ft = fuzz.fuzz_transforms
TIME_LIMIT_S = 10.0


@pytest.mark.parametrize(
    ("what", "count"),
    [
        ("text", 400),
        ("api", 2000),
        ("transforms", 400),
        ("inputs", 300),
        ("programs", 30),
        ("sessions", 300),
        ("ops", 1000),
    ],
)
def test_fuzzed_inputs_give_only_project_errors_and_never_hang(what, count):
    outcomes, examples = fuzz.fuzz(what, count, seed=17, timeout_s=TIME_LIMIT_S)
    assert all(outcomes[bad] == 0 for bad in fuzz.BAD), examples
    assert outcomes["project error"] > 0 and sum(outcomes.values()) == count


def _within(seconds: float, call: Callable[[], Any]) -> None:
    """``call()``, failing the test if it runs past ``seconds`` (a hang)."""

    def alarm(_signum: int, _frame: Any) -> None:
        raise AssertionError(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        call()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@functools.cache
def _calls() -> list:
    return ft.transform_calls()


@functools.cache
def _programs() -> Any:
    return ft.Programs()


WRONG_VALUES = st.one_of(
    st.sampled_from(ft.VALUES),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.binary(max_size=3),
    st.lists(st.integers(-3, 5), max_size=4),
    st.tuples(st.text(max_size=3), st.integers(-2, 5)),
    st.dictionaries(st.text(max_size=3), st.integers(-1, 3), max_size=2),
    st.booleans(),
    st.none(),
)


def _fast(examples: int) -> settings:
    return settings(
        max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )


@_fast(1000)
@given(index=st.integers(0, 10_000), value=WRONG_VALUES)
def test_transforms_answer_wrong_arguments_with_a_located_project_error(index, value):
    """The transforms, propagate, execute(_step), distribute, collect and simulate, one
    argument drawn of a wrong type or range: accepted, or a DistIRError naming the
    parameter or the value, within the time bound."""
    name, param, call = _calls()[index % len(_calls())]
    try:
        _within(TIME_LIMIT_S, lambda: call(value))
    except ir.DistIRError as e:
        assert ft.located(str(e), param, value), (name, ft.shown(value), str(e))


@_fast(500)
@given(seed=st.integers(0, 2**32 - 1))
def test_mutated_inputs_to_the_executor_give_project_errors(seed):
    """Inputs of wrong count, shape, dtype, nesting, values and size to execute,
    execute_step, distribute and collect, on sequential and distributed programs."""
    _, run = ft.input_case(random.Random(seed), _programs())
    with contextlib.suppress(ir.DistIRError):
        _within(TIME_LIMIT_S, run)


@_fast(120)
@given(seed=st.integers(0, 2**32 - 1))
def test_a_transform_that_accepts_a_valid_program_computes_what_it_computes(seed):
    """A drawn program through a transform with drawn parameters: refused with a project
    error, or executed equal to the sequential program (a WrongOutputError fails)."""
    _, run = fuzz.fuzz_programs.program_case(random.Random(seed))
    with contextlib.suppress(ir.DistIRError):
        _within(4 * TIME_LIMIT_S, run)


@pytest.mark.parametrize(
    "shape", ["x", "4", 1.5, None, object(), [2.0], [True, 2], {"a": 1}, np.float32(2)]
)
def test_a_mesh_shape_that_is_not_integers_is_a_mesh_error(shape):
    with pytest.raises(ir.DistIRError, match="mesh shape"):
        Mesh(shape)


def test_mesh_devices_must_be_integers_and_numpy_integers_are():
    with pytest.raises(ir.DistIRError, match="mesh devices"):
        Mesh((2,), [0, 1.5])
    assert Mesh(np.int64(2), np.array([3, 4])).devices == (3, 4)


@pytest.mark.parametrize(
    "args",
    [(None,), (0,), ("01",), ([0], 5), ([0, 1], [(0, 2, 1)]), ([0], (), {0: 5}), ([0], (), [1])],
)
def test_a_sharding_spec_of_the_wrong_shape_is_an_annotation_error(args):
    with pytest.raises(ir.DistIRError):
        ShardingSpec(*args)


def test_an_array_where_a_name_is_expected_is_refused():
    mlp = models.mlp(8, 16, 32, 4)
    with pytest.raises(ir.DistIRError, match="combine"):
        ir.simulate(mlp, ir.Topology.uniform(2), combine=np.array([1, 2]))
    s = Session(mlp, ir.Topology.uniform(4))
    assert not s.annotate(np.array([1, 2]), (Mesh((4,)), ["S(1)"]))
    assert "not a value of the program" in s.error


def test_a_device_map_with_too_few_sub_devices_is_a_type_error_when_simulated():
    """Found by fuzzing (2 inputs in 100,000): pmap's device_map gave device 2 one
    sub-device where the body names ``d.1``; simulate raised a bare IndexError."""
    golden = Path(__file__).resolve().parent / "ir" / "golden" / "nested_pmap.txt"
    text = golden.read_text().replace("2: [2, 4]", "2: [2]")
    f = ir.parse(text)
    with pytest.raises(ir.DistIRError, match=r"sub-device 1 of device 2.* lists 1 sub-device"):
        ir.simulate(f, ir.Topology.uniform(5))
