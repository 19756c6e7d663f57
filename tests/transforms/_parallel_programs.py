"""Programs and checks the parallelism tests share (hand-built until ir.models lands)."""

from __future__ import annotations

import numpy as np

import ir
from ir import DType, FunctionBuilder, TensorType

F64 = DType.float64


def mlp(
    batch: int,
    features: int,
    hidden: int,
    classes: int,
    layers: int = 2,
    training: bool = False,
    optimizer: str = "sgd",
    activation: str = "Relu",
) -> ir.Function:
    """The seeds' MLP: weights first, then x (and z when training); Relu between layers."""
    b = FunctionBuilder("mlp")
    sizes = [features] + [hidden] * (layers - 1) + [classes]
    ws = [b.input(f"w{i}", TensorType((sizes[i], sizes[i + 1]), F64, 0)) for i in range(layers)]
    states = []
    if training and optimizer == "adam":
        for i, w in enumerate(ws):
            states.append((b.input(f"m{i}", w.type), b.input(f"v{i}", w.type)))
    x = b.input("x", TensorType((batch, features), F64, 0))
    z = b.input("z", TensorType((batch,), DType.int64, 0)) if training else None
    acts = [x]
    pre = []
    h = x
    for i, w in enumerate(ws):
        a = b.call("MatMul", h, w, name=f"a{i}")
        pre.append(a)
        h = b.call(activation, a, name=f"h{i}") if i < layers - 1 else a
        acts.append(h)
    y = h
    if not training:
        return b.finish([y])
    loss = b.call("Loss", y, z, name="l")
    dy = b.call("LossGrad", y, z, name="dy")
    grads = [None] * layers
    for i in reversed(range(layers)):
        grads[i], da = b.call("MatMulGrad", acts[i], ws[i], dy, name=[f"dw{i}", f"da{i}"])
        if i > 0:
            dy = b.call(activation + "Grad", pre[i - 1], da, name=f"dh{i - 1}")
    new = []
    for i, w in enumerate(ws):
        if optimizer == "adam":
            m, v = states[i]
            w1, m1, v1 = b.call("Adam", w, grads[i], m, v, name=[f"w{i}_1", f"m{i}_1", f"v{i}_1"])
            new += [w1, m1, v1]
        else:
            new.append(b.call("SGDOptimizer", w, grads[i], lr=0.1, name=f"w{i}_1"))
    return b.finish([*new, y, loss])


def inputs_for(f: ir.Function, seed: int = 0) -> list:
    """Random inputs; Adam's second moments (inputs named v...) made positive."""
    args = ir.random_inputs(f, seed)
    return [np.abs(a) if v.name.startswith("v") else a for v, a in zip(f.inputs, args)]


def assert_same(
    f: ir.Function, g: ir.Function, seed: int = 0, rtol: float = 1e-5, steps: int = 2
) -> None:
    """Step ``g`` computes ``f``'s outputs: the sequential inputs laid out by ``g``'s layouts
    (``ir.distribute``), the outputs collected (replicas must agree). Each further step
    runs ``g`` on its own outputs as they are (a steady-state step's updated weights stay
    where they live; a distributing program's are collected) and ``f`` likewise."""
    args = inputs_for(f, seed)
    got_args = ir.distribute(g, args, source=f)
    for step in range(steps):
        want = ir.execute(f, args)
        out = ir.execute(g, got_args)
        got = ir.collect(g, out, rtol=rtol)
        assert len(want) == len(got)
        for i, (w, o) in enumerate(zip(want, got)):
            copies = o if isinstance(o, tuple) else (o,)
            for c in copies:
                np.testing.assert_allclose(
                    c, w, rtol=rtol, atol=1e-10, err_msg=f"step {step}, output {i}"
                )
        carried_out = out if g.input_layouts else got
        args, got_args = next_inputs(f, args, want), next_inputs(f, got_args, carried_out)


def next_inputs(f: ir.Function, inputs: list, outputs: list) -> list:
    """The next step's inputs: each input replaced by the output that updates it."""
    from ir.transforms._emit import carried_inputs

    carried = {source: f.outputs.index(out) for out, source in carried_inputs(f).items()}
    return [outputs[carried[v]] if v in carried else x for v, x in zip(f.inputs, inputs)]


def transformer_block(batch: int, seq: int, hidden: int, heads: int) -> ir.Function:
    """One pre-LayerNorm GPT block (causal attention + Gelu MLP, residuals), forward."""
    b = FunctionBuilder("block")
    hd = hidden // heads
    w = {
        n: b.input(n, TensorType(s, F64, 0))
        for n, s in [
            ("g1", (hidden,)),
            ("b1", (hidden,)),
            ("wq", (hidden, hidden)),
            ("wk", (hidden, hidden)),
            ("wv", (hidden, hidden)),
            ("wo", (hidden, hidden)),
            ("g2", (hidden,)),
            ("b2", (hidden,)),
            ("wfc", (hidden, 4 * hidden)),
            ("wproj", (4 * hidden, hidden)),
        ]
    }
    x = b.input("x", TensorType((batch, seq, hidden), F64, 0))
    n1 = b.call("LayerNorm", x, w["g1"], w["b1"], name="n1")

    def heads_of(name: str, perm: tuple[int, ...]) -> ir.Value:
        t = b.call("MatMul", n1, w["w" + name], name=name)
        t = b.call("Reshape", t, shape=(batch, seq, heads, hd), name=f"{name}_h")
        return b.call("Transpose", t, perm=perm, name=f"{name}_t")

    q, kt, v = heads_of("q", (0, 2, 1, 3)), heads_of("k", (0, 2, 3, 1)), heads_of("v", (0, 2, 1, 3))
    s = b.call("Scale", b.call("MatMul", q, kt, name="s"), factor=hd**-0.5, name="s_scaled")
    p = b.call("Softmax", b.call("CausalMask", s, name="masked"), name="p")
    o = b.call("Transpose", b.call("MatMul", p, v, name="o"), perm=(0, 2, 1, 3), name="o_t")
    o = b.call("Reshape", o, shape=(batch, seq, hidden), name="o_flat")
    x1 = b.call("Add", x, b.call("MatMul", o, w["wo"], name="attn"), name="x1")
    n2 = b.call("LayerNorm", x1, w["g2"], w["b2"], name="n2")
    h = b.call("Gelu", b.call("MatMul", n2, w["wfc"], name="fc"), name="h")
    y = b.call("Add", x1, b.call("MatMul", h, w["wproj"], name="proj"), name="y")
    return b.finish([y])


def model(name: str) -> ir.Function:
    """Small float64 programs from ir.models: forward and training MLPs and GPTs."""
    import ir.models
    from ir.transforms import training

    if name == "mlp":
        return ir.models.mlp(8, 4, 6, 5, layers=3, dtype=F64)
    if name == "mlp_sgd":
        return ir.models.mlp(8, 4, 6, 5, layers=2, training=True, dtype=F64)
    if name == "mlp_adam":
        return training(ir.models.mlp(7, 3, 4, 4, layers=2, dtype=F64), optimizer="adam")
    if name == "gpt":
        return ir.models.gpt(4, 3, 8, 2, 11, 2, dtype=F64)
    if name == "gpt_sgd":  # 12 words: megatron splits the vocabulary over 2 tensor ranks
        return ir.models.gpt(4, 3, 8, 2, 12, 1, training=True, dtype=F64)
    raise KeyError(name)


MODELS = ("mlp", "mlp_sgd", "mlp_adam", "gpt", "gpt_sgd")


def biased_mlp(training: bool = True) -> ir.Function:
    """Two layers with biases, Tanh and an mse loss (the bias gradients are ReduceSums)."""
    from ir.transforms import training as make_training

    b = FunctionBuilder("biased")
    w1 = b.input("w1", TensorType((4, 8), F64, 0))
    b1 = b.input("b1", TensorType((8,), F64, 0))
    w2 = b.input("w2", TensorType((8, 3), F64, 0))
    b2 = b.input("b2", TensorType((3,), F64, 0))
    x = b.input("x", TensorType((6, 4), F64, 0))
    z = b.input("z", TensorType((6, 3), F64, 0))
    a = b.call("Add", b.call("MatMul", x, w1, name="a"), b1, name="ab")
    y = b.call("Add", b.call("MatMul", b.call("Tanh", a, name="h"), w2, name="o"), b2, name="y")
    f = b.finish([y, b.call("Loss", y, z, kind="mse", name="l")])
    return make_training(f) if training else f
