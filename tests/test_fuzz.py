"""benchmarks/fuzz.py in small: mutated programs and wrong API arguments give only project
errors, within a time bound; and the API bugs its first run found stay fixed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import ir
from ir import models
from ir.sharding import Mesh, ShardingSpec
from workbench import Session

_SPEC = importlib.util.spec_from_file_location(
    "fuzz", Path(__file__).resolve().parents[1] / "benchmarks" / "fuzz.py"
)
fuzz = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(fuzz)


@pytest.mark.parametrize(("what", "count"), [("text", 400), ("api", 2000)])
def test_fuzzed_inputs_give_only_project_errors_and_never_hang(what, count):
    outcomes, examples = fuzz.fuzz(what, count, seed=17, timeout_s=10)
    assert outcomes["other exception"] == 0 and outcomes["timeout"] == 0, examples
    assert outcomes["project error"] > 0 and sum(outcomes.values()) == count


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
