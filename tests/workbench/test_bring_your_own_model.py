"""``Workbench.from_torch`` / ``Workbench.from_onnx`` / ``Workbench.save_onnx``: a torch
module or an ONNX file in, sharded by annotations, saved with them, read back equal."""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir.sharding import Mesh, S, annotate

torch = pytest.importorskip("torch", reason="the importers extra (torch) is not installed")
pytest.importorskip("onnx", reason="the importers extra (onnx) is not installed")
pytest.importorskip("ipywidgets", reason="the workbench extra (ipywidgets) is not installed")

from workbench import Workbench  # noqa: E402


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)
    ).eval()


def test_from_torch_then_shard_save_and_reopen(tmp_path):
    net = _mlp()
    x = torch.randn(8, 6)
    topology = ir.Topology.preset("a100-hgx", 2)
    wb = Workbench.from_torch(net, (x,), topology)
    assert wb.weight_names == ("_0_weight", "_0_bias", "_2_weight", "_2_bias")
    (y,) = ir.execute(wb.session.base, wb.arguments)
    np.testing.assert_allclose(y, net(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    mesh = Mesh((2,))
    assert wb.annotate("_0_weight", (mesh, [S(0)])), wb.session.error
    assert wb.annotate("_2_weight", (mesh, [S(1)])), wb.session.error
    path = tmp_path / "mlp.onnx"
    wb.save_onnx(path)

    again = Workbench.from_onnx(path, topology)
    assert again.weight_names == wb.weight_names
    assert dict(again.session.annotations) == {  # a session keeps placements as tuples
        "_0_weight": (mesh, (S(0),)),
        "_2_weight": (mesh, (S(1),)),
    }
    distributed = again.session.current.function
    (got,) = ir.execute_step(distributed, {**again.arguments, "input": x.numpy()}, rtol=1e-5)
    np.testing.assert_allclose(got, y, rtol=1e-5, atol=1e-6)
    assert again.undo() and not again.session.annotations  # the file's annotations: one step


def test_a_bad_file_leaves_nothing_half_made(tmp_path):
    path = tmp_path / "broken.onnx"
    path.write_bytes(b"\x08\x07 not a model")
    with pytest.raises(ir.DistIRError, match=r"broken\.onnx"):
        Workbench.from_onnx(path)


def test_cli_report_on_an_onnx_file(tmp_path):
    from workbench.__main__ import main

    f, args = ir.from_torch(_mlp(), (torch.randn(8, 6),))
    path = tmp_path / "mlp.onnx"
    ir.to_onnx(annotate(f, {"_0_weight": (Mesh((2,)), [S(0)])}), path, weights=args[:-1])
    out = tmp_path / "report.html"
    argv = ["report", "--model", str(path), "--devices", "2", "--strategy", "dp=2", "--quiet"]
    assert main([*argv, "--strategy", "pp=1", "--out", str(out)]) == 0
    text = out.read_text()
    assert "mlp.onnx (ONNX)" in text
