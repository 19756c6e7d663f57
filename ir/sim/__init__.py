"""The simulator: per-device timelines, memory curves and step time of a program on a topology.

>>> import ir
>>> b = ir.FunctionBuilder("f")
>>> x = b.input("x", ir.TensorType((256, 256), device=0))
>>> y = b.call("MatMul", x, x, name="y")
>>> result = ir.simulate(b.finish([y]), ir.Topology.uniform(1, peak_flops=1e12))
>>> round(result.step_time_s * 1e6, 1)  # 2 * 256^3 flops at 1 TFLOPS, in microseconds
33.6
"""

from __future__ import annotations

from ..arguments import bool_arg, function_arg
from ..device import Topology
from ..errors import ArgumentError
from ..function import Function
from .costs import OpCosts
from .engine import COMBINE_MODES, COMM_MODES, Engine, SimulationError
from .result import Event, SimResult

__all__ = [
    "COMBINE_MODES",
    "COMM_MODES",
    "Event",
    "OpCosts",
    "SimResult",
    "SimulationError",
    "simulate",
]


def simulate(
    function: Function,
    topology: Topology,
    *,
    combine: str = "roofline",
    comm: str = "channels",
    symmetry: bool = True,
    costs: OpCosts | None = None,
) -> SimResult:
    """Simulate one run of ``function`` on ``topology``.

    Compute ops take ``launch_overhead_s + max(t_flops, bytes /
    mem_bandwidth_bytes_per_s)`` on their device (``combine="roofline"``, the
    default: one kernel is bound by whichever of arithmetic and memory traffic
    is slower), or the sum of the two (``combine="additive"``, for small,
    latency-bound CPU kernels that overlap neither). ``t_flops`` times the cost's
    ``matrix_flops`` at the device's matrix peak for the op's element type and
    the rest at its vector peak (``Device.peak_flops_for``; TF32 for float32
    matmuls only when ``topology.allow_tf32``). Communication ops take the
    alpha-beta time of :mod:`ir.collectives`.

    ``comm="channels"`` (the default) runs each point-to-point transfer on the
    FIFO channel of its (source, destination) pair and each collective on the
    channel of its group, so independent transfers overlap; ``comm="serial"``
    gives each device one FIFO communication stream, which every transfer it
    takes part in waits for. ``comm="blocking"`` is ``"channels"`` where a transfer
    also holds the compute of every device taking part (it starts when their compute
    is free, and their compute waits for its end): CPU processes whose communication
    is work on the cores they compute on (gloo on a machine with no spare core per
    process), or a backend that does not overlap. See ``docs/simulator.md``.

    ``symmetry``: walk a pmap body once per rank class the program declares
    (``Function.rank_classes``: the devices of a 3D stage do identical work at
    identical times), the other members sharing the walked device's events and
    memory, and schedule each pmap body whose ops all compute on its device once per
    device model, its many applications (a stage's microbatches) timed from their
    inputs without walking their ops (``ir.sim.bodies``); ``False`` walks every op on
    every device (the reference both are tested against, equal to the last bit).

    ``costs``: measured op times (:class:`ir.sim.costs.OpCosts`, from
    ``ir.backends.profile.profile_ops``) used instead of the models above for every op
    the table holds; the others keep the models.
    """
    function_arg("simulate", "function", function)
    if not isinstance(topology, Topology):
        raise ArgumentError(
            f"simulate: topology must be an ir.Topology (Topology.preset(...), "
            f"Topology.uniform(...)), got {topology!r}"
        )
    symmetry = bool_arg("simulate", "symmetry", symmetry)
    classes = function.rank_classes if symmetry else ()
    if costs is not None and not isinstance(costs, OpCosts):
        raise ArgumentError(
            f"simulate: costs must be an ir.sim.costs.OpCosts (from "
            f"ir.backends.profile.profile_ops), got {type(costs).__name__}"
        )
    engine = Engine(
        topology, combine, comm=comm, classes=classes, costs=costs, share_bodies=symmetry
    )
    engine.run(function)
    return SimResult(engine)
