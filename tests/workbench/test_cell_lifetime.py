"""A workbench lives as long as the cell output that shows it: running its cell again
closes what the earlier runs made (every widget a workbench holds, shown or not), so
a kernel whose notebook ran ten times holds one dashboard, and a reloaded page restores
one. Checked on held widgets directly, through a stand-in kernel request, and in a real
kernel sent the requests JupyterLab sends."""

from __future__ import annotations

import json
import sys
import textwrap
from typing import ClassVar

import ipywidgets
import pytest
from ipywidgets.widgets.widget import _instances

import ir
import widgets.cells as cells
from ir import models
from widgets.chart import plotly_library
from workbench import Workbench
from workbench.example import example_model, example_topology


def _open(widget: ipywidgets.Widget) -> bool:
    return widget.comm is not None


def test_closing_a_workbench_closes_every_widget_it_made_and_nothing_else():
    library = plotly_library()
    other = Workbench(example_model(), example_topology())
    before = set(_instances)
    wb = Workbench(models.mlp(16, 8, 8, 4, layers=2), ir.Topology.preset("a100-hgx", 2))
    wb.set_strategy(dp=2)
    wb.compare()
    result = wb.search(zero=(0,))
    wb.compare_search_rows(*result.simulated()[:2])  # charts made inside the search panel
    wb.mode.value = "serving"  # a panel made on demand, then hidden again
    wb.mode.value = "training"
    made = set(_instances) - before
    assert len(made) > 250  # the dashboard, its panels, its charts
    assert made <= {w.model_id for w in cells.held_widgets(wb)}  # none out of reach
    wb.close()
    assert set(_instances) == before  # all of it gone, nothing else
    assert _open(library) and all(_open(w) for w in cells.held_widgets(other))
    # the session stays usable from code, and no longer redraws a closed dashboard
    redrawn: list[int] = []
    wb.refresh = lambda: redrawn.append(1)
    assert wb.session.set_strategy(dp=1) and wb.session.result.step_time_s > 0
    assert redrawn == [] and set(_instances) == before
    wb.close()  # twice is harmless
    assert other.set_strategy(dp=4) and _open(other.gantt)


def test_a_cell_run_again_closes_what_its_earlier_runs_made(monkeypatch):
    run = {"now": ("cell-a", "request-1")}
    monkeypatch.setattr(cells, "current_run", lambda: run["now"])
    first = Workbench(example_model(), example_topology())
    second = Workbench(example_model(), example_topology())  # the same run: both stay
    assert _open(first) and _open(second)
    run["now"] = ("cell-b", "request-2")
    elsewhere = Workbench(example_model(), example_topology())
    run["now"] = ("cell-a", "request-3")  # cell a again
    third = Workbench(example_model(), example_topology())
    assert not _open(first) and not _open(second)
    assert not any(_open(w) for w in cells.held_widgets(first))  # all of it
    assert _open(third) and _open(elsewhere)
    run["now"] = None  # no cell named (a script, a click's handler): nothing closes
    fourth = Workbench(example_model(), example_topology())
    assert _open(third) and _open(fourth)
    for wb in (third, elsewhere, fourth):
        wb.close()


def test_the_running_cell_is_read_from_the_kernel_request(monkeypatch):
    class Kernel:
        parent: ClassVar[dict] = {}

        def get_parent(self, channel=None):
            return self.parent

    class Shell:
        kernel = Kernel()

    import IPython

    monkeypatch.setattr(IPython, "get_ipython", lambda: Shell())
    execute = {"header": {"msg_type": "execute_request", "msg_id": "m1"}}
    Kernel.parent = {**execute, "metadata": {"cellId": "c1"}}
    assert cells.current_run() == ("c1", "m1")
    Kernel.parent = {**execute, "metadata": {}}  # a front end that names no cell
    assert cells.current_run() is None
    Kernel.parent = {"header": {"msg_type": "comm_msg", "msg_id": "m2"}, "metadata": {}}
    assert cells.current_run() is None  # a click's handler runs no cell
    monkeypatch.setattr(IPython, "get_ipython", lambda: None)
    assert cells.current_run() is None


MAKE = textwrap.dedent(
    """
    from workbench import Workbench
    from workbench.example import example_model, example_topology
    wb = Workbench(example_model(), example_topology())
    """
)
COUNT = textwrap.dedent(
    """
    from ipywidgets.widgets.widget import _instances
    from workbench.dashboard import Workbench as _W
    open_workbenches = sum(isinstance(w, _W) for w in list(_instances.values()))
    """
)


def test_a_real_kernel_keeps_one_workbench_per_cell_however_often_it_runs():
    jupyter_client = pytest.importorskip("jupyter_client")
    km = jupyter_client.KernelManager(kernel_name="python3")  # this Python's ipykernel
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)

        def run(code: str, cell: str) -> dict:
            msg = kc.session.msg("execute_request", {"code": code, "silent": False})
            msg["metadata"]["cellId"] = cell  # as JupyterLab sends it
            kc.shell_channel.send(msg)
            while True:
                reply = kc.get_shell_msg(timeout=120)
                if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                    assert reply["content"]["status"] == "ok", reply["content"]
                    return reply

        def open_count() -> int:
            reply = kc.execute_interactive(
                COUNT, user_expressions={"n": "open_workbenches"}, timeout=60, output_hook=None
            )
            return int(json.loads(reply["content"]["user_expressions"]["n"]["data"]["text/plain"]))

        for _ in range(3):
            run(MAKE, "the-example-cell")
        assert open_count() == 1
        run(MAKE, "another-cell")
        assert open_count() == 2
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
