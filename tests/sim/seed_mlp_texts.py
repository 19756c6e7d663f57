"""The seed's MLP programs (seed 000) in the text format, N = 2 and K = 2:
B, F, H, C = 64, 32, 48, 16; data and horizontal parallelism on devices 1 and 2
(the batch and weights start on device 0), pipeline stages on devices 0 and 1."""

from __future__ import annotations

DATA_PARALLEL = """
def mlp_dp(
    wA: Tensor[(32, 48), 0],
    wB: Tensor[(48, 16), 0],
    x: Tensor[(64, 32), 0],
    z: Tensor[(64,), 0],
):
    xs: Tuple[Tensor[(32, 32), 1], Tensor[(32, 32), 2]] = Scatter(x, devices=[1, 2])
    zs: Tuple[Tensor[(32,), 1], Tensor[(32,), 2]] = Scatter(z, devices=[1, 2])
    wAs: Tuple[Tensor[(32, 48), 1], Tensor[(32, 48), 2]] = Broadcast(wA, devices=[1, 2])
    wBs: Tuple[Tensor[(48, 16), 1], Tensor[(48, 16), 2]] = Broadcast(wB, devices=[1, 2])
    (
        dwAis: Tuple[Tensor[(32, 48), 1], Tensor[(32, 48), 2]],
        dwBis: Tuple[Tensor[(48, 16), 1], Tensor[(48, 16), 2]],
        ys: Tuple[Tensor[(32, 16), 1], Tensor[(32, 16), 2]],
        ls: Tuple[Float[1], Float[2]],
    ) = pmap(
        device_var=d,
        fn=lambda (xi: Tensor[(32, 32), d]),
                  (zi: Tensor[(32,), d]),
                  (wAi: Tensor[(32, 48), d]),
                  (wBi: Tensor[(48, 16), d]): {
            ai: Tensor[(32, 48), d] = MatMul(xi, wAi)
            yi: Tensor[(32, 16), d] = MatMul(ai, wBi)
            li: Float[d] = Loss(yi, zi, denominator=64)
            dli: Tensor[(32, 16), d] = LossGrad(yi, zi, denominator=64)
            (dwBi, dai): Tuple[Tensor[(48, 16), d], Tensor[(32, 48), d]] = MatMulGrad(ai, wBi, dli)
            (dwAi, v_): Tuple[Tensor[(32, 48), d], Tensor[(32, 32), d]] = MatMulGrad(xi, wAi, dai)
            return dwAi, dwBi, yi, li
        },
        (xs, zs, wAs, wBs)
    )
    dwBs: Tuple[Tensor[(48, 16), 1], Tensor[(48, 16), 2]] = AllReduce(dwBis)
    dwAs: Tuple[Tensor[(32, 48), 1], Tensor[(32, 48), 2]] = AllReduce(dwAis)
    (
        wA1s: Tuple[Tensor[(32, 48), 1], Tensor[(32, 48), 2]],
        wB1s: Tuple[Tensor[(48, 16), 1], Tensor[(48, 16), 2]],
    ) = pmap(
        device_var=d,
        fn=lambda (wAi: Tensor[(32, 48), d]),
                  (wBi: Tensor[(48, 16), d]),
                  (dwAi: Tensor[(32, 48), d]),
                  (dwBi: Tensor[(48, 16), d]): {
            wB1i: Tensor[(48, 16), d] = SGDOptimizer(wBi, dwBi)
            wA1i: Tensor[(32, 48), d] = SGDOptimizer(wAi, dwAi)
            return wA1i, wB1i
        },
        (wAs, wBs, dwAs, dwBs)
    )
    x_1: Tensor[(32, 48), 1] = TupleGet(wA1s, index=0)
    wA1: Tensor[(32, 48), 0] = Send(x_1, to_device=0)
    x_2: Tensor[(48, 16), 1] = TupleGet(wB1s, index=0)
    wB1: Tensor[(48, 16), 0] = Send(x_2, to_device=0)
    y: Tensor[(64, 16), 0] = Gather(ys, to_device=0)
    l: Float[0] = Reduce(ls, to_device=0)
    return wA1, wB1, y, l
"""

HORIZONTAL = """
def mlp_hp(
    wA: Tensor[(32, 48), 0],
    wB: Tensor[(48, 16), 0],
    x: Tensor[(64, 32), 0],
    z: Tensor[(64,), 0],
):
    xs: Tuple[Tensor[(64, 32), 1], Tensor[(64, 32), 2]] = Broadcast(x, devices=[1, 2])
    zs: Tuple[Tensor[(64,), 1], Tensor[(64,), 2]] = Broadcast(z, devices=[1, 2])
    wAs: Tuple[Tensor[(32, 24), 1], Tensor[(32, 24), 2]] = Scatter(wA, dim=1, devices=[1, 2])
    wBs: Tuple[Tensor[(24, 16), 1], Tensor[(24, 16), 2]] = Scatter(wB, devices=[1, 2])
    (
        yis: Tuple[Tensor[(64, 16), 1], Tensor[(64, 16), 2]],
        ais: Tuple[Tensor[(64, 24), 1], Tensor[(64, 24), 2]],
    ) = pmap(
        device_var=d,
        fn=lambda (xi: Tensor[(64, 32), d]),
                  (wAi: Tensor[(32, 24), d]),
                  (wBi: Tensor[(24, 16), d]): {
            ai: Tensor[(64, 24), d] = MatMul(xi, wAi)
            yi: Tensor[(64, 16), d] = MatMul(ai, wBi)
            return yi, ai
        },
        (xs, wAs, wBs)
    )
    ys: Tuple[Tensor[(64, 16), 1], Tensor[(64, 16), 2]] = AllReduce(yis)
    (
        wA1s: Tuple[Tensor[(32, 24), 1], Tensor[(32, 24), 2]],
        wB1s: Tuple[Tensor[(24, 16), 1], Tensor[(24, 16), 2]],
        ls: Tuple[Float[1], Float[2]],
    ) = pmap(
        device_var=d,
        fn=lambda (y: Tensor[(64, 16), d]),
                  (z: Tensor[(64,), d]),
                  (ai: Tensor[(64, 24), d]),
                  (xi: Tensor[(64, 32), d]),
                  (wAi: Tensor[(32, 24), d]),
                  (wBi: Tensor[(24, 16), d]): {
            l: Float[d] = Loss(y, z)
            dl: Tensor[(64, 16), d] = LossGrad(y, z)
            (dwBi, dai): Tuple[Tensor[(24, 16), d], Tensor[(64, 24), d]] = MatMulGrad(ai, wBi, dl)
            (dwAi, v_): Tuple[Tensor[(32, 24), d], Tensor[(64, 32), d]] = MatMulGrad(xi, wAi, dai)
            wB1i: Tensor[(24, 16), d] = SGDOptimizer(wBi, dwBi)
            wA1i: Tensor[(32, 24), d] = SGDOptimizer(wAi, dwAi)
            return wA1i, wB1i, l
        },
        (ys, zs, ais, xs, wAs, wBs)
    )
    wA1: Tensor[(32, 48), 0] = Gather(wA1s, dim=1, to_device=0)
    wB1: Tensor[(48, 16), 0] = Gather(wB1s, to_device=0)
    x_1: Tensor[(64, 16), 1] = TupleGet(ys, index=0)
    y: Tensor[(64, 16), 0] = Send(x_1, to_device=0)
    x_2: Float[1] = TupleGet(ls, index=0)
    l: Float[0] = Send(x_2, to_device=0)
    return wA1, wB1, y, l
"""

PIPELINE = """
def mlp_pp(
    wA: Tensor[(32, 48), 0],
    wB: Tensor[(48, 16), 1],
    x: Tensor[(64, 32), 0],
    z: Tensor[(64,), 1],
):
    xs: Tuple[Tensor[(32, 32), 0], Tensor[(32, 32), 0]] = Split(x, partitions=2)
    zs: Tuple[Tensor[(32,), 1], Tensor[(32,), 1]] = Split(z, partitions=2)
    x_0: Tensor[(32, 32), 0] = TupleGet(xs, index=0)
    x_1: Tensor[(32, 32), 0] = TupleGet(xs, index=1)
    z_0: Tensor[(32,), 1] = TupleGet(zs, index=0)
    z_1: Tensor[(32,), 1] = TupleGet(zs, index=1)
    a0_0: Tensor[(32, 48), 0] = MatMul(x_0, wA)
    a1_0: Tensor[(32, 48), 1] = Send(a0_0, to_device=1)
    a0_1: Tensor[(32, 48), 0] = MatMul(x_1, wA)
    a1_1: Tensor[(32, 48), 1] = Send(a0_1, to_device=1)
    y_0: Tensor[(32, 16), 1] = MatMul(a1_0, wB)
    l_0: Float[1] = Loss(y_0, z_0, denominator=64)
    y_1: Tensor[(32, 16), 1] = MatMul(a1_1, wB)
    l_1: Float[1] = Loss(y_1, z_1, denominator=64)
    dl_0: Tensor[(32, 16), 1] = LossGrad(y_0, z_0, denominator=64)
    (dwB_0, da1_0): Tuple[Tensor[(48, 16), 1], Tensor[(32, 48), 1]] = MatMulGrad(a1_0, wB, dl_0)
    da0_0: Tensor[(32, 48), 0] = Send(da1_0, to_device=0)
    (dwA_0, v_): Tuple[Tensor[(32, 48), 0], Tensor[(32, 32), 0]] = MatMulGrad(x_0, wA, da0_0)
    dl_1: Tensor[(32, 16), 1] = LossGrad(y_1, z_1, denominator=64)
    (dwB_1, da1_1): Tuple[Tensor[(48, 16), 1], Tensor[(32, 48), 1]] = MatMulGrad(a1_1, wB, dl_1)
    da0_1: Tensor[(32, 48), 0] = Send(da1_1, to_device=0)
    (dwA_1, v__1): Tuple[Tensor[(32, 48), 0], Tensor[(32, 32), 0]] = MatMulGrad(x_1, wA, da0_1)
    dwA: Tensor[(32, 48), 0] = Sum(dwA_0, dwA_1)
    dwB: Tensor[(48, 16), 1] = Sum(dwB_0, dwB_1)
    y: Tensor[(64, 16), 1] = Concat(y_0, y_1)
    l: Float[1] = Sum(l_0, l_1)
    wB1: Tensor[(48, 16), 1] = SGDOptimizer(wB, dwB)
    wA1: Tensor[(32, 48), 0] = SGDOptimizer(wA, dwA)
    return wA1, wB1, y, l
"""

SEQUENTIAL = """
def mlp(
    wA: Tensor[(32, 48), 0],
    wB: Tensor[(48, 16), 0],
    x: Tensor[(64, 32), 0],
    z: Tensor[(64,), 0],
):
    a: Tensor[(64, 48), 0] = MatMul(x, wA)
    y: Tensor[(64, 16), 0] = MatMul(a, wB)
    l: Float[0] = Loss(y, z)
    dl: Tensor[(64, 16), 0] = LossGrad(y, z)
    (dwB, da): Tuple[Tensor[(48, 16), 0], Tensor[(64, 48), 0]] = MatMulGrad(a, wB, dl)
    (dwA, v_): Tuple[Tensor[(32, 48), 0], Tensor[(64, 32), 0]] = MatMulGrad(x, wA, da)
    wB1: Tensor[(48, 16), 0] = SGDOptimizer(wB, dwB)
    wA1: Tensor[(32, 48), 0] = SGDOptimizer(wA, dwA)
    return wA1, wB1, y, l
"""
