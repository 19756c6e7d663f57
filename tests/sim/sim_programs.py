"""Programs the simulator tests share: the seed's MLP (sequential, data-parallel,
horizontal, model-parallel, pipeline) and a uniform pipeline of MatMul stages.

The parallel MLPs follow seed 000 with N = 2 (devices 1 and 2 for data and
horizontal parallelism, 0 and 1 for model and pipeline parallelism).
"""

from __future__ import annotations

import itertools

import ir
from ir import DeviceVar, FunctionBuilder, TensorType

B, F, H, C = 64, 32, 48, 16
D = DeviceVar("d")


def T(*shape: int, device=0) -> TensorType:
    return TensorType(tuple(shape), device=device)


def mlp_sequential(device: int = 0) -> ir.Function:
    """Seed 000's sequential MLP training step."""
    b = FunctionBuilder("mlp")
    wA, wB = b.input("wA", T(F, H, device=device)), b.input("wB", T(H, C, device=device))
    x, z = b.input("x", T(B, F, device=device)), b.input("z", T(B, device=device))
    a = b.call("MatMul", x, wA, name="a")
    y = b.call("MatMul", a, wB, name="y")
    l = b.call("Loss", y, z, name="l")  # noqa: E741 -- the seed's name
    dl = b.call("LossGrad", y, z, name="dl")
    dwB, da = b.call("MatMulGrad", a, wB, dl, name=["dwB", "da"])
    dwA, _ = b.call("MatMulGrad", x, wA, da, name=["dwA", "_"])
    wB1 = b.call("opt", wB, dwB, name="wB1")
    wA1 = b.call("opt", wA, dwA, name="wA1")
    return b.finish([wA1, wB1, y, l])


def _pmap(b: FunctionBuilder, body: ir.Function, *tuples: ir.Value, names: list[str]):
    out = b.call("Pmap", *tuples, subfunctions=[body], device_var="d", name=names)
    return out if isinstance(out, tuple) else (out,)


def mlp_data_parallel(n: int = 2) -> ir.Function:
    """Seed 000's data-parallel MLP: scatter the batch, pmap fwd/bwd, all-reduce, pmap opt."""
    b = FunctionBuilder("mlp_dp")
    wA, wB = b.input("wA", T(F, H)), b.input("wB", T(H, C))
    x, z = b.input("x", T(B, F)), b.input("z", T(B))
    devices = list(range(1, n + 1))
    xs = b.call("Scatter", x, dim=0, devices=devices, name="xs")
    zs = b.call("Scatter", z, dim=0, devices=devices, name="zs")
    wAs = b.call("Broadcast", wA, devices=devices, name="wAs")
    wBs = b.call("Broadcast", wB, devices=devices, name="wBs")

    fb = FunctionBuilder("dp_step")
    xi, zi = fb.input("xi", T(B // n, F, device=D)), fb.input("zi", T(B // n, device=D))
    wAi, wBi = fb.input("wAi", T(F, H, device=D)), fb.input("wBi", T(H, C, device=D))
    ai = fb.call("MatMul", xi, wAi, name="ai")
    yi = fb.call("MatMul", ai, wBi, name="yi")
    li = fb.call("Loss", yi, zi, denominator=B, name="li")
    dli = fb.call("LossGrad", yi, zi, denominator=B, name="dli")
    dwBi, dai = fb.call("MatMulGrad", ai, wBi, dli, name=["dwBi", "dai"])
    dwAi, _ = fb.call("MatMulGrad", xi, wAi, dai, name=["dwAi", "_"])
    step = fb.finish([dwAi, dwBi, yi, li])
    dwAis, dwBis, ys, ls = _pmap(b, step, xs, zs, wAs, wBs, names=["dwAis", "dwBis", "ys", "ls"])
    dwBs = b.call("AllReduce", dwBis, name="dwBs")
    dwAs = b.call("AllReduce", dwAis, name="dwAs")

    ob = FunctionBuilder("dp_opt")
    w_a, w_b = ob.input("wAi", T(F, H, device=D)), ob.input("wBi", T(H, C, device=D))
    g_a, g_b = ob.input("dwAi", T(F, H, device=D)), ob.input("dwBi", T(H, C, device=D))
    wB1i = ob.call("opt", w_b, g_b, name="wB1i")
    wA1i = ob.call("opt", w_a, g_a, name="wA1i")
    opt = ob.finish([wA1i, wB1i])
    wA1s, wB1s = _pmap(b, opt, wAs, wBs, dwAs, dwBs, names=["wA1s", "wB1s"])
    wA1 = b.call("Send", b.call("TupleGet", wA1s, index=0), to_device=0, name="wA1")
    wB1 = b.call("Send", b.call("TupleGet", wB1s, index=0), to_device=0, name="wB1")
    y = b.call("Gather", ys, dim=0, to_device=0, name="y")
    l = b.call("Reduce", ls, to_device=0, name="l")  # noqa: E741
    return b.finish([wA1, wB1, y, l])


def mlp_horizontal(n: int = 2) -> ir.Function:
    """Seed 000's horizontal (Megatron) MLP: wA split by columns, wB by rows, all-reduce y."""
    b = FunctionBuilder("mlp_hp")
    wA, wB = b.input("wA", T(F, H)), b.input("wB", T(H, C))
    x, z = b.input("x", T(B, F)), b.input("z", T(B))
    devices = list(range(1, n + 1))
    xs = b.call("Broadcast", x, devices=devices, name="xs")
    zs = b.call("Broadcast", z, devices=devices, name="zs")
    wAs = b.call("Scatter", wA, dim=1, devices=devices, name="wAs")
    wBs = b.call("Scatter", wB, dim=0, devices=devices, name="wBs")

    fb = FunctionBuilder("hp_forward")
    xi = fb.input("xi", T(B, F, device=D))
    wAi, wBi = fb.input("wAi", T(F, H // n, device=D)), fb.input("wBi", T(H // n, C, device=D))
    ai = fb.call("MatMul", xi, wAi, name="ai")
    yi = fb.call("MatMul", ai, wBi, name="yi")
    yis, ais = _pmap(b, fb.finish([yi, ai]), xs, wAs, wBs, names=["yis", "ais"])
    ys = b.call("AllReduce", yis, name="ys")

    bb = FunctionBuilder("hp_backward")
    y, zi = bb.input("y", T(B, C, device=D)), bb.input("z", T(B, device=D))
    ai, xi = bb.input("ai", T(B, H // n, device=D)), bb.input("xi", T(B, F, device=D))
    wAi, wBi = bb.input("wAi", T(F, H // n, device=D)), bb.input("wBi", T(H // n, C, device=D))
    li = bb.call("Loss", y, zi, name="l")
    dl = bb.call("LossGrad", y, zi, name="dl")
    dwBi, dai = bb.call("MatMulGrad", ai, wBi, dl, name=["dwBi", "dai"])
    dwAi, _ = bb.call("MatMulGrad", xi, wAi, dai, name=["dwAi", "_"])
    wB1i = bb.call("opt", wBi, dwBi, name="wB1i")
    wA1i = bb.call("opt", wAi, dwAi, name="wA1i")
    back = bb.finish([wA1i, wB1i, li])
    wA1s, wB1s, ls = _pmap(b, back, ys, zs, ais, xs, wAs, wBs, names=["wA1s", "wB1s", "ls"])
    wA1 = b.call("Gather", wA1s, dim=1, to_device=0, name="wA1")
    wB1 = b.call("Gather", wB1s, dim=0, to_device=0, name="wB1")
    y = b.call("Send", b.call("TupleGet", ys, index=0), to_device=0, name="y")
    l = b.call("Send", b.call("TupleGet", ls, index=0), to_device=0, name="l")  # noqa: E741
    return b.finish([wA1, wB1, y, l])


def mlp_pipeline(k: int = 4) -> ir.Function:
    """Seed 000's pipeline MLP: stage 0 (MatMul by wA) on device 0, stage 1 on device 1,
    ``k`` microbatches in GPipe order (all forwards, then all backwards)."""
    b = FunctionBuilder("mlp_pp")
    wA, wB = b.input("wA", T(F, H)), b.input("wB", T(H, C, device=1))
    x, z = b.input("x", T(B, F)), b.input("z", T(B, device=1))
    xs = b.call("Split", x, partitions=k, dim=0, name="xs")
    zs = b.call("Split", z, partitions=k, dim=0, name="zs")
    xi = [b.call("TupleGet", xs, index=i, name=f"x_{i}") for i in range(k)]
    zi = [b.call("TupleGet", zs, index=i, name=f"z_{i}") for i in range(k)]
    a1, ys, ls = [], [], []
    for i in range(k):
        a0 = b.call("MatMul", xi[i], wA, name=f"a0_{i}")
        a1.append(b.call("Send", a0, to_device=1, name=f"a1_{i}"))
    for i in range(k):
        ys.append(b.call("MatMul", a1[i], wB, name=f"y_{i}"))
        ls.append(b.call("Loss", ys[i], zi[i], denominator=B, name=f"l_{i}"))
    dwAs, dwBs = [], []
    for i in range(k):
        dl = b.call("LossGrad", ys[i], zi[i], denominator=B, name=f"dl_{i}")
        dwB, da1 = b.call("MatMulGrad", a1[i], wB, dl, name=[f"dwB_{i}", f"da1_{i}"])
        dwBs.append(dwB)
        da0 = b.call("Send", da1, to_device=0, name=f"da0_{i}")
        dwA, _ = b.call("MatMulGrad", xi[i], wA, da0, name=[f"dwA_{i}", "_"])
        dwAs.append(dwA)
    dwA = b.call("Sum", *dwAs, name="dwA")
    dwB = b.call("Sum", *dwBs, name="dwB")
    y = b.call("Concat", *ys, dim=0, name="y")
    l = b.call("Sum", *ls, name="l")  # noqa: E741
    wB1 = b.call("opt", wB, dwB, name="wB1")
    wA1 = b.call("opt", wA, dwA, name="wA1")
    return b.finish([wA1, wB1, y, l])


def uniform_pipeline(stages: int, microbatches: int, size: int = 64) -> ir.Function:
    """A chain of equal MatMul stages on devices 0..stages-1 with a Send between stages,
    ``microbatches`` microbatches written in order (microbatch-major)."""
    b = FunctionBuilder("uniform_pipeline")
    ws = [b.input(f"w{s}", T(size, size, device=s)) for s in range(stages)]
    xs = [b.input(f"x{m}", T(size, size, device=0)) for m in range(microbatches)]
    outs = []
    for m in range(microbatches):
        h = xs[m]
        for s in range(stages):
            if s > 0:
                h = b.call("Send", h, to_device=s, name=f"h{s}_{m}")
            h = b.call("MatMul", h, ws[s], name=f"a{s}_{m}")
        outs.append(h)
    return b.finish(outs)


def assert_streams_never_overlap(result: ir.SimResult) -> None:
    """No two events of one device's compute stream, or of one communication channel of it,
    overlap (different channels may)."""
    by_stream: dict[tuple[int, str, str], list] = {}
    for ev in result.events:
        assert ev.dur_s >= 0
        by_stream.setdefault((ev.device, ev.stream, ev.channel), []).append(ev)
    for events in by_stream.values():
        events.sort(key=lambda ev: ev.start_s)
        for a, b in itertools.pairwise(events):
            assert a.end_s <= b.start_s + 1e-15, (a.label, b.label)


def nested_pmap_matmul() -> ir.Function:
    """Seed 002's nested pmap: data parallel over devices 1 and 2, each splitting its
    matmul by columns with a sub-device (device_map {1: [1, 3], 2: [2, 4]})."""
    b = FunctionBuilder("nested_pmap")
    wA, x = b.input("wA", T(F, H)), b.input("x", T(B, F))
    xs = b.call("Scatter", x, dim=0, devices=[1, 2], name="xs")
    wAs = b.call("Broadcast", wA, devices=[1, 2], name="wAs")
    d1 = DeviceVar("d", (1,))

    inner = FunctionBuilder("column")
    dd = DeviceVar("dd")
    xij = inner.input("xij", T(B // 2, F, device=dd))
    wAij = inner.input("wAij", T(F, H // 2, device=dd))
    inner_body = inner.finish([inner.call("MatMul", xij, wAij, name="aij")])

    outer = FunctionBuilder("row")
    xi, wAi = outer.input("xi", T(B // 2, F, device=D)), outer.input("wAi", T(F, H, device=D))
    xis = outer.call("Broadcast", xi, devices=[D, d1], name="xis")
    wAis = outer.call("Scatter", wAi, dim=1, devices=[D, d1], name="wAis")
    ais = outer.call("Pmap", xis, wAis, subfunctions=[inner_body], device_var="dd", name="ais")
    ai = outer.call("Gather", ais, dim=1, to_device=D, name="ai")
    body = outer.finish([ai])
    as_ = b.call(
        "Pmap",
        xs,
        wAs,
        subfunctions=[body],
        device_var="d",
        device_map={1: [1, 3], 2: [2, 4]},
        name="as",
    )
    return b.finish([b.call("Gather", as_, dim=0, to_device=0, name="a")])
