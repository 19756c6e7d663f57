"""The ATen op table of ``ir.from_torch``: one (ATen op, function) pair per supported op.

Each function receives a :class:`Lowering` (the builder, and how to turn a graph
argument into a ``Value``) and the fx node, and returns the ``Value`` (or tuple
of values, for ATen ops with several results) that the node computes, built
from registry ops. Pure copies (``clone``, ``alias``, ``detach``) return their
operand: they compute nothing. A function raises :class:`Unsupported` with a
reason when an overload's arguments fall outside what the registry ops cover
(a slice with a step, a layer norm over several axes).

The table is keyed by the ATen overload's name (``"aten.add.Tensor"``) so that
importing this module does not import torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..types import DType
from ..value import Value

TORCH_DTYPES = {  # torch's dtype names -> DistIR's
    "torch.float32": DType.float32,
    "torch.float64": DType.float64,
    "torch.float16": DType.float16,
    "torch.bfloat16": DType.bfloat16,
    "torch.int64": DType.int64,
    "torch.int32": DType.int32,
    "torch.bool": DType.bool,
}


class Unsupported(Exception):  # noqa: N818  (internal signal, never escapes the importer)
    """The node's op or arguments have no registry translation; ``reason`` says why."""


class Lowering:
    """What a table function needs: the builder, and graph arguments as ``Value``s.

    ``value(arg)`` returns the ``Value`` of an fx node argument; a Python number
    becomes a rank-0 ``Constant`` of the dtype ``like`` has (torch's scalar
    promotion keeps the tensor's dtype).
    """

    def __init__(
        self,
        builder,
        values: dict,
        dtype_of: Callable[[Any], DType],
        device,
        lift: Callable[[Any, str], Value] | None = None,
    ) -> None:
        self.b = builder
        self.values = values
        self.dtype_of = dtype_of  # fx node -> DType of its result (from torch's metadata)
        self.device = device
        self._lift = lift  # (array, name) -> an input of the program holding the array
        self.parameters: set = set()  # the fx placeholders of the module's parameters
        # places per expert of an imported MoE layer (None: dropless; see _aten_moe)
        self.moe_capacity_factor: float | None = None

    def lifted(self, array, name: str) -> Value:
        """A constant array as the program sees it: a ``Constant`` op when uniform, else a
        lifted constant (an input ``const_<name>`` whose array the import returns)."""
        if array.size and (array == array.reshape(-1)[0]).all():
            return self.constant(
                array.reshape(-1)[0].item(), DType.from_numpy(array.dtype), array.shape
            )
        if self._lift is None:
            raise Unsupported("a constant tensor, which this lowering cannot lift")
        return self._lift(array, name)

    def value(self, arg, like: DType | None = None) -> Value:
        if isinstance(arg, (bool, int, float)):
            dtype = like or (DType.bool if isinstance(arg, bool) else DType.float32)
            return self.constant(arg, dtype)
        return self.values[arg]

    def constant(self, number, dtype: DType, shape: tuple[int, ...] = ()) -> Value:
        return self.b.call(
            "Constant",
            value=_plain(number, dtype),
            shape=shape,
            dtype=dtype.value,
            device=self.device,
            name="c",
        )

    def cast(self, v: Value, dtype: DType) -> Value:
        if v.type.dtype is dtype:
            return v
        return self.b.call("Cast", v, dtype=dtype.value, name=f"{v.name}_cast")

    def operands(self, node, args) -> list[Value]:
        """Tensor or scalar operands of an elementwise op, cast to the node's result dtype."""
        out = self.dtype_of(node)
        return [self.cast(self.value(a, out), out) for a in args]

    def promoted(self, *args) -> DType:
        """The dtype torch computes an op on ``args`` in (fx nodes or Python numbers): a
        comparison's operands meet there, not at its bool result."""
        import torch

        vals = [a.meta["val"] if hasattr(a, "meta") else a for a in args]
        result = torch.result_type(*vals) if len(vals) == 2 else vals[0].dtype
        if str(result) not in TORCH_DTYPES:
            raise Unsupported(f"dtype {result}")
        return TORCH_DTYPES[str(result)]

    def common(self, *args) -> list[Value]:
        """``args`` as Values of their promoted dtype (:meth:`promoted`)."""
        dtype = self.promoted(*args)
        return [self.cast(self.value(a, dtype), dtype) for a in args]

    def call(self, op_type: str, *inputs: Value, node=None, **attributes) -> Value:
        return self.b.call(
            op_type, *inputs, name=node.name if node is not None else None, **attributes
        )


def _plain(number, dtype: DType):
    if dtype is DType.bool:
        return bool(number)
    if dtype.is_float:
        return float(number)
    return int(number)


def _shape(node) -> tuple[int, ...]:
    return tuple(int(d) for d in node.meta["val"].shape)


def _axis(dim: int, rank: int) -> int:
    return dim % rank if rank else 0


# -- table functions -----------------------------------------------------------------


def _passthrough(lw: Lowering, node):
    return lw.value(node.args[0])


def _reshape(lw: Lowering, node):
    x = lw.value(node.args[0])
    shape = _shape(node)
    if x.type.shape == shape:
        return x
    return lw.call("Reshape", x, node=node, shape=shape)


def _expand(lw: Lowering, node):
    x = lw.value(node.args[0])
    shape = _shape(node)
    if x.type.shape == shape:
        return x
    return lw.call("BroadcastTo", x, node=node, shape=shape)


def _permute(lw: Lowering, node):
    x = lw.value(node.args[0])
    perm = tuple(_axis(int(p), x.type.rank) for p in node.args[1])
    return lw.call("Transpose", x, node=node, perm=perm)


def _transpose_int(lw: Lowering, node):
    x = lw.value(node.args[0])
    r = x.type.rank
    i, j = _axis(node.args[1], r), _axis(node.args[2], r)
    perm = list(range(r))
    perm[i], perm[j] = perm[j], perm[i]
    return lw.call("Transpose", x, node=node, perm=tuple(perm))


def _t(lw: Lowering, node):
    x = lw.value(node.args[0])
    return x if x.type.rank < 2 else lw.call("Transpose", x, node=node, perm=(1, 0))


def _binary(op_type: str):
    def lower(lw: Lowering, node):
        if node.kwargs.get("alpha", 1) != 1:
            raise Unsupported("alpha != 1")
        a, b = lw.operands(node, node.args[:2])
        return lw.call(op_type, a, b, node=node)

    return lower


def _unary(op_type: str, **attributes):
    def lower(lw: Lowering, node):
        (x,) = lw.operands(node, node.args[:1])
        return lw.call(op_type, x, node=node, **attributes)

    return lower


def _pow(lw: Lowering, node):
    x, exponent = node.args[:2]
    if not isinstance(exponent, (int, float)):
        raise Unsupported("a tensor exponent")
    (x,) = lw.operands(node, [x])
    if exponent == 2:  # x * x is exact where x ** 2.0 may round differently
        return lw.call("Mul", x, x, node=node)
    return lw.call("Pow", x, node=node, exponent=float(exponent))


def _gelu(lw: Lowering, node):
    (x,) = lw.operands(node, node.args[:1])
    approximate = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
    if approximate == "tanh":
        return lw.call("Gelu", x, node=node)
    # exact GELU: x * 0.5 * (1 + erf(x / sqrt(2)))
    erf = lw.b.call("Erf", lw.b.call("Scale", x, factor=1 / math.sqrt(2.0)), name="erf")
    one = lw.constant(1.0, x.type.dtype)
    half = lw.b.call("Scale", lw.b.call("Add", erf, one), factor=0.5)
    return lw.call("Mul", x, half, node=node)


def _silu(lw: Lowering, node):
    (x,) = lw.operands(node, node.args[:1])
    return lw.call("Mul", x, lw.b.call("Sigmoid", x, name=f"{node.name}_sigmoid"), node=node)


def _matmul(lw: Lowering, node):
    a, b = (lw.value(x) for x in node.args[:2])
    return lw.call("MatMul", a, b, node=node)


def _addmm(lw: Lowering, node):
    if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
        raise Unsupported("beta or alpha != 1")
    bias, a, b = (lw.value(x) for x in node.args[:3])
    product = lw.b.call("MatMul", a, b, name=f"{node.name}_mm")
    return lw.call("Add", product, bias, node=node)


def _layer_norm(lw: Lowering, node):
    x, normalized_shape, weight, bias, eps = node.args[:5]
    x = lw.value(x)
    if len(normalized_shape) != 1:
        raise Unsupported(f"normalising {len(normalized_shape)} axes (LayerNorm takes the last)")
    (n,) = normalized_shape
    dtype = x.type.dtype
    gamma = lw.value(weight) if weight is not None else lw.constant(1.0, dtype, (n,))
    beta = lw.value(bias) if bias is not None else lw.constant(0.0, dtype, (n,))
    y = lw.call("LayerNorm", x, gamma, beta, node=node, epsilon=float(eps))
    return (y, None, None)  # mean and rstd: read by training graphs only


def _softmax(lw: Lowering, node):
    x, dim = node.args[:2]
    x = lw.value(x)
    return lw.call("Softmax", x, node=node, axis=_axis(dim, x.type.rank))


def _reduce(op_type: str):
    def lower(lw: Lowering, node):
        x = lw.value(node.args[0])
        if node.kwargs.get("dtype") is not None:
            raise Unsupported("a dtype argument")
        dims = node.args[1] if len(node.args) > 1 else None
        keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        axes = None if not dims else tuple(_axis(d, x.type.rank) for d in dims)
        return lw.call(op_type, x, node=node, axes=axes, keepdims=bool(keepdim))

    return lower


def _where(lw: Lowering, node):
    cond = lw.value(node.args[0])
    a, b = lw.operands(node, node.args[1:3])
    return lw.call("Where", cond, a, b, node=node)


def _masked_fill(lw: Lowering, node):
    x, mask, fill = node.args[:3]
    x = lw.value(x)
    filler = lw.cast(lw.value(fill, x.type.dtype), x.type.dtype)
    return lw.call("Where", lw.value(mask), filler, x, node=node)


def _slice_bounds(n: int, start, end) -> tuple[int, int]:
    start = 0 if start is None else start
    end = n if end is None else end
    start = max(0, min(n, start + n if start < 0 else start))
    end = max(start, min(n, end + n if end < 0 else end))
    return start, end


def _slice(lw: Lowering, node):
    x = lw.value(node.args[0])
    given = [*node.args[1:], *[None] * 4]
    dim, start, end, step = given[0] or 0, given[1], given[2], given[3] or 1
    if step != 1:
        raise Unsupported(f"a step of {step}")
    axis = _axis(dim, x.type.rank)
    start, end = _slice_bounds(x.type.shape[axis], start, end)
    if (start, end) == (0, x.type.shape[axis]):
        return x
    return lw.call("Slice", x, node=node, axis=axis, start=start, end=end)


def _select(lw: Lowering, node):
    x, dim, index = lw.value(node.args[0]), node.args[1], node.args[2]
    axis = _axis(dim, x.type.rank)
    index = index % x.type.shape[axis]
    piece = lw.b.call("Slice", x, axis=axis, start=index, end=index + 1, name=f"{node.name}_at")
    return lw.call("Reshape", piece, node=node, shape=_shape(node))


def _split(lw: Lowering, node):
    x = lw.value(node.args[0])
    sizes, dim = node.args[1], node.args[2] if len(node.args) > 2 else 0
    axis = _axis(dim, x.type.rank)
    n = x.type.shape[axis]
    if isinstance(sizes, int):
        sizes = [min(sizes, n - s) for s in range(0, n, sizes)]
    pieces, start = [], 0
    for k, size in enumerate(sizes):
        end = start + size
        pieces.append(
            lw.b.call("Slice", x, axis=axis, start=start, end=end, name=f"{node.name}_{k}")
        )
        start = end
    return tuple(pieces)


def _cat(lw: Lowering, node):
    tensors = [lw.value(a) for a in node.args[0]]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    out = lw.dtype_of(node)
    tensors = [lw.cast(v, out) for v in tensors if v.type.num_elements or len(tensors) == 1]
    return lw.call("Concat", *tensors, node=node, dim=_axis(dim, tensors[0].type.rank))


def _to_copy(lw: Lowering, node):
    x = lw.value(node.args[0])
    return lw.cast(x, lw.dtype_of(node))


def _gather(lw: Lowering, node):
    x, dim, index = lw.value(node.args[0]), node.args[1], lw.value(node.args[2])
    axis = _axis(dim, x.type.rank)
    for d, n in enumerate(index.type.shape):  # torch reads only the first n along other axes
        if d != axis and n != x.type.shape[d]:
            x = lw.b.call("Slice", x, axis=d, start=0, end=n, name=f"{node.name}_x")
    return lw.call("TakeAlongAxis", x, index, node=node, axis=axis)


def _embedding(lw: Lowering, node):
    table, ids = lw.value(node.args[0]), lw.value(node.args[1])
    padding_idx = node.args[2] if len(node.args) > 2 else node.kwargs.get("padding_idx", -1)
    if tuple(node.args[4:5]) == (True,) or node.kwargs.get("sparse"):
        raise Unsupported("sparse gradients")
    pad = None if padding_idx < 0 else int(padding_idx)
    return lw.call("Embedding", table, ids, node=node, padding_idx=pad)


TABLE: dict[str, Callable[[Lowering, Any], Any]] = {
    # pure copies and views that keep the data
    "aten.clone.default": _passthrough,
    "aten.alias.default": _passthrough,
    "aten.detach.default": _passthrough,
    "aten.lift_fresh_copy.default": _passthrough,
    "aten.contiguous.default": _passthrough,
    "aten.dropout.default": _passthrough,  # eval mode: identity
    # shapes
    "aten.view.default": _reshape,
    "aten._unsafe_view.default": _reshape,
    "aten.reshape.default": _reshape,
    "aten.unsqueeze.default": _reshape,
    "aten.squeeze.default": _reshape,
    "aten.squeeze.dim": _reshape,
    "aten.squeeze.dims": _reshape,
    "aten.expand.default": _expand,
    "aten.permute.default": _permute,
    "aten.transpose.int": _transpose_int,
    "aten.t.default": _t,
    "aten.slice.Tensor": _slice,
    "aten.select.int": _select,
    "aten.split_with_sizes.default": _split,
    "aten.split.Tensor": _split,
    "aten.cat.default": _cat,
    "aten._to_copy.default": _to_copy,
    # arithmetic
    "aten.add.Tensor": _binary("Add"),
    "aten.sub.Tensor": _binary("Sub"),
    "aten.mul.Tensor": _binary("Mul"),
    "aten.div.Tensor": _binary("Div"),
    "aten.neg.default": _unary("Neg"),
    "aten.pow.Tensor_Scalar": _pow,
    "aten.sqrt.default": _unary("Sqrt"),
    "aten.rsqrt.default": _unary("Rsqrt"),
    "aten.exp.default": _unary("Exp"),
    "aten.sin.default": _unary("Sin"),
    "aten.cos.default": _unary("Cos"),
    "aten.erf.default": _unary("Erf"),
    "aten.where.self": _where,
    "aten.masked_fill.Scalar": _masked_fill,
    # activations and layers
    "aten.relu.default": _unary("Relu"),
    "aten.tanh.default": _unary("Tanh"),
    "aten.sigmoid.default": _unary("Sigmoid"),
    "aten.silu.default": _silu,
    "aten.gelu.default": _gelu,
    "aten._softmax.default": _softmax,
    "aten.native_layer_norm.default": _layer_norm,
    "aten.embedding.default": _embedding,
    "aten.gather.default": _gather,
    # products and reductions
    "aten.mm.default": _matmul,
    "aten.bmm.default": _matmul,
    "aten.addmm.default": _addmm,
    "aten.mean.dim": _reduce("ReduceMean"),
    "aten.mean.default": _reduce("ReduceMean"),
    "aten.sum.dim_IntList": _reduce("ReduceSum"),
    "aten.sum.default": _reduce("ReduceSum"),
}

# ATen ops that compute nothing a program keeps: runtime checks torch.export records.
CHECKS = frozenset(
    {
        "aten._assert_tensor_metadata.default",
        "aten._assert_scalar.default",
        "aten.sym_constrain_range_for_size.default",
        "aten._assert_async.msg",
    }
)

# Convolutions, batch norm and pooling (NCHW in torch, NHWC in the registry).
from ._aten_attention import TABLE as _ATTENTION  # noqa: E402  (they read Lowering above)
from ._aten_conv import TABLE as _CONV  # noqa: E402
from ._aten_index import TABLE as _INDEX  # noqa: E402
from ._aten_moe import TABLE as _MOE  # noqa: E402
from ._aten_scalar import TABLE as _SCALAR  # noqa: E402

TABLE.update(_CONV)
TABLE.update(_SCALAR)
TABLE.update(_INDEX)
TABLE.update(_ATTENTION)
TABLE.update(_MOE)
