"""``from_torch``: a PyTorch module, through ``torch.export``, as a verified ``Function``.

The module is exported (``torch.export.export``; a Hugging Face model's key/value
caches are registered as pytrees first, so that their tensors are outputs) and
decomposed to torch's core ATen op set (``run_decompositions``), scaled dot-product
attention kept whole. Then:

* parameters, buffers and the program's constant tensors become named inputs, in
  the exported program's order; their names are the state-dict names made valid
  identifiers (:func:`weight_name`: ``h.0.attn.c_attn.weight`` ->
  ``h_0_attn_c_attn_weight``);
* the example inputs come next, named as the module's ``forward`` names them;
* what depends on no input at all (position ranges, causal masks built by
  ``arange``/``full``/comparisons) is evaluated once by torch at import time: a
  uniform result becomes a ``Constant`` op, any other one a last input named
  ``const_<node>`` (torch.export calls these lifted constants), one whose rows repeat
  its repeated block broadcast where it is read (a causal mask made at the batch's
  shape, BLOOM's ALiBi bias repeated to ``batch * heads`` rows). No constant has the
  batch's leading size (a leading 1 where it would), so that the transforms, which take
  the non-weight inputs of the batch's size for the batch, never split one;
* every other ATen node becomes the registry ops of its entry in
  ``ir.importers._aten.TABLE`` (one op, or a few for fused ATen ops such as
  ``addmm``).

ATen ops without an entry are collected over the whole graph and reported
together in one :class:`UnsupportedOpsError`: each op with its count and the
source line torch recorded for it. The nodes after an unsupported one are still
lowered (on a placeholder of the type torch recorded), so that every unsupported op
is listed at once.

Weights are not copied: each array is a view of the module's own tensor (bfloat16
through ``ml_dtypes``), so an imported program holds no second copy of the model.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..builder import FunctionBuilder
from ..errors import DistIRError
from ..function import Function
from ..types import DType, TensorType
from ..value import Value
from ..verify import verify
from . import _aten
from ._fold import drop_broadcasts, fold_batched_matmuls

__all__ = ["TorchImportError", "UnsupportedOpsError", "from_torch", "weight_name"]


class TorchImportError(DistIRError):
    """A module that ``ir.from_torch`` cannot import (torch could not export it, or its
    program uses what the registry has no op for)."""


class UnsupportedOpsError(TorchImportError):
    """The exported program uses ATen ops the importer has no registry op for.

    ``ops`` maps each ATen op (with the reason where only some of its arguments are
    unsupported) to ``(count, source line)``.
    """

    def __init__(
        self, module: str, ops: dict[str, tuple[int, str]], notes: Sequence[str] = ()
    ) -> None:
        self.ops = ops
        lines = [f"  {op} x{count}: {where}" for op, (count, where) in ops.items()]
        if notes:  # Hugging Face experts modules the import could not make one op
            lines.append(
                "Mixture-of-experts layers left as their ATen ops (the importer maps gated "
                "SiLU experts only; see docs/experts.md):"
            )
            lines.extend(f"  {note}" for note in dict.fromkeys(notes))
        super().__init__(
            f"{module}: {len(ops)} ATen op(s) have no registry translation "
            f"(add them to ir.importers._aten.TABLE, with a registry op where needed):\n"
            + "\n".join(lines)
        )


def weight_name(key: str) -> str:
    """A state-dict key as a valid identifier: every other character becomes ``_``.

    >>> weight_name("transformer.h.0.attn.c_attn.weight")
    'transformer_h_0_attn_c_attn_weight'
    >>> weight_name("0.weight")
    '_0_weight'
    """
    name = re.sub(r"\W", "_", key)
    return f"_{name}" if not name or name[0].isdigit() else name


def from_torch(
    module: Any,
    example_inputs: Sequence[Any],
    *,
    name: str | None = None,
    device: int = 0,
    moe_capacity_factor: float | None = None,
) -> tuple[Function, list[np.ndarray | None]]:
    """Import ``module`` as a ``Function`` and the arrays to run it on.

    Returns ``(function, arguments)``: the arguments are numpy arrays in the
    function's input order (parameters and buffers, then ``example_inputs``, then
    the ``const_*`` tensors folded from shapes), so that
    ``ir.execute(function, arguments)`` reproduces ``module(*example_inputs)``.
    Every value lives on ``device``. Put the module in eval mode first if it has
    dropout or batch statistics. A module and inputs on the ``meta`` device import
    too, with ``None`` for their arrays: a program of real size to simulate, not to
    execute.

    A Hugging Face mixture-of-experts model (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, ...:
    transformers' experts modules with gated SiLU experts) imports with each MoE layer as
    the registry's MoE ops (``ir.importers._hf_experts``, ``_aten_moe``).
    ``moe_capacity_factor`` sets their places per expert and sequence: None (the
    default) is exact, dropless routing as transformers computes it, with a buffer of
    ``S`` places per expert (the simulator then charges each expert every token of a
    sequence: ``E / k`` times its uniform load); a number ``f`` gives
    ``ceil(f * S * k / E)`` places (costed at ``f`` times the uniform load, choices past
    an expert's capacity dropped, so the outputs may differ from torch's).

    >>> import torch, numpy as np, ir
    >>> net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU()).eval()
    >>> f, args = ir.from_torch(net, (torch.ones(2, 3),))
    >>> [v.name for v in f.inputs]
    ['_0_weight', '_0_bias', 'input']
    >>> bool(np.allclose(ir.execute(f, args)[0], net(torch.ones(2, 3)).detach().numpy()))
    True
    """
    import torch

    from ._hf_experts import experts_as_one_op

    factor = moe_capacity_factor
    if factor is not None and (
        isinstance(factor, bool)
        or not isinstance(factor, (int, float))
        or not 0 < factor < math.inf
    ):
        raise TorchImportError(
            f"moe_capacity_factor={moe_capacity_factor!r} must be a positive number (places "
            "per expert as a multiple of the uniform load) or None (dropless, exact)"
        )
    label = f"{type(module).__module__}.{type(module).__qualname__}"
    with experts_as_one_op(module) as notes:
        program = _export(torch, module, tuple(example_inputs), label)
    importer = _Importer(torch, program, tuple(example_inputs), label, device, notes, factor)
    return importer.run(name or type(module).__name__.lower())


def _export(torch, module, example_inputs: tuple, label: str):
    _register_caches(module)
    try:
        program = torch.export.export(module, example_inputs)
    except Exception as e:  # torch raises many kinds: report its reason, with the module
        advice = (
            "Pass use_cache=False (a wrapper module that calls the model with it): its "
            "key/value cache is a type torch cannot flatten"
            if "Cache" in str(e)
            else "Make the forward traceable (no data-dependent Python control flow, outputs "
            "that are tensors or tuples of them), or wrap it in a module that is."
        )
        raise TorchImportError(
            f"torch.export could not trace {label} ({type(e).__name__}):\n    {_reason(e)}\n"
            + advice
        ) from e
    table = torch.export.default_decompositions()
    for op in [op for op in table if any(k in str(op) for k in _KEPT)]:
        del table[op]  # attention stays one op, not its math; pooling not a strided view
    try:
        return program.run_decompositions(table)
    except Exception as e:
        raise TorchImportError(
            f"torch.export traced {label}, but torch's own decomposition to core ATen "
            f"(run_decompositions) failed ({type(e).__name__}):\n    {_reason(e)}\n"
            "The module is traceable: this is a torch limitation; please report it with "
            "the module."
        ) from e


# ATen ops kept whole (their decomposition is worse to read): fused attention, and 1-d
# adaptive pooling (an as_strided view)
_KEPT = ("scaled_dot_product", "adaptive_avg_pool1d")


def _reason(e: Exception) -> str:
    reason = str(e).strip().splitlines()
    return "\n    ".join(reason[:12]) if reason else type(e).__name__


def _register_caches(module) -> None:
    """Hugging Face key/value caches as pytrees: their tensors become program outputs."""
    if "transformers" not in type(module).__module__ and not any(
        "transformers" in type(m).__module__ for m in module.modules()
    ):
        return
    try:
        from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model
    except ImportError:  # older transformers: the DynamicCache only
        try:
            from transformers.integrations.executorch import (
                register_dynamic_cache_export_support,
            )
        except ImportError:
            return
        register_dynamic_cache_export_support()
        return
    for m in module.modules():
        if "transformers" in type(m).__module__:
            register_cache_pytrees_for_model(m)
            return


_DTYPES = _aten.TORCH_DTYPES


def _source_line(node) -> str:
    """The innermost ``File ..., line N`` and its code that torch recorded for ``node``."""
    trace = node.meta.get("stack_trace") or ""
    lines = [ln.strip() for ln in trace.strip().splitlines()]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("File "):
            code = lines[i + 1] if i + 1 < len(lines) else ""
            return f"{lines[i]}: {code}".rstrip(": ")
    stack = node.meta.get("nn_module_stack") or {}
    if stack:
        path, cls = list(stack.values())[-1]
        return f"in {path or 'the module'} ({cls})"
    return f"node {node.name} (torch recorded no source line)"


def _repeated_block(tensor) -> int | None:
    """The fewest leading rows that ``tensor`` repeats along axis 0 (1: every row the same,
    a causal mask made at the batch's shape; the heads: BLOOM's ALiBi bias repeated to
    ``batch * heads`` rows), or None if it repeats none. Such a constant is the block,
    repeated where it is read: no input of the batch's size, and the transforms build
    the repeat per microbatch (``ir.transforms.data_parallel.batch_broadcasts``)."""
    n = tensor.shape[0] if tensor.dim() else 0
    for rows in range(1, n // 2 + 1):
        if n % rows == 0:
            tiles = tensor.reshape(n // rows, rows, *tensor.shape[1:])
            if bool((tiles == tiles[:1]).all()):
                return rows
    return None


def _repeat_rows(b: FunctionBuilder, block: Value, shape: tuple[int, ...]) -> Value:
    """``block`` (one row ``(1, ...)``, or ``(1, rows, ...)``) repeated along axis 0 of
    ``shape``."""
    if block.type.rank == len(shape):  # one row: (1, ...)
        return b.call("BroadcastTo", block, shape=shape)
    rows = block.type.shape[1]
    tiled = b.call("BroadcastTo", block, shape=(shape[0] // rows, *block.type.shape[1:]))
    return b.call("Reshape", tiled, shape=shape)


class _Importer:
    def __init__(
        self,
        torch,
        program,
        example_inputs: tuple,
        label: str,
        device: int,
        notes: Sequence[str] = (),
        moe_capacity_factor: float | None = None,
    ) -> None:
        self.notes = notes  # experts modules left as their ATen ops, and why
        self.moe_capacity_factor = moe_capacity_factor
        self.torch = torch
        self.program = program
        self.example_inputs = example_inputs
        self.label = label
        self.device = device
        self.graph = program.graph

    # -- dtypes and arrays ------------------------------------------------------------

    def dtype(self, node) -> DType:
        val = node.meta.get("val")
        key = str(getattr(val, "dtype", None))
        if key not in _DTYPES:
            raise _aten.Unsupported(f"dtype {key}")
        return _DTYPES[key]

    def array(self, tensor) -> np.ndarray | None:
        """The tensor's data as an array that shares its memory (no copy for a contiguous
        CPU tensor; bfloat16 through ml_dtypes); None on the meta device."""
        if tensor.device.type == "meta":
            return None  # shapes only: a model too big to hold, for simulation
        tensor = tensor.detach().cpu().contiguous()
        if str(tensor.dtype) == "torch.bfloat16":
            return tensor.view(self.torch.int16).numpy().view(DType.bfloat16.numpy)
        return tensor.numpy()

    # -- the walk ---------------------------------------------------------------------

    def _placeholder_arrays(self) -> dict:
        """Each placeholder node's tensor: state dict, constants, then the user's inputs."""
        torch = self.torch
        flat_user, _ = torch.utils._pytree.tree_flatten(self.example_inputs)
        user = iter(flat_user)
        placeholders = [n for n in self.graph.nodes if n.op == "placeholder"]
        out = {}
        for node, spec in zip(placeholders, self.program.graph_signature.input_specs):
            kind = spec.kind.name
            if kind == "USER_INPUT":
                out[node] = next(user)
            elif spec.target in self.program.state_dict:
                out[node] = self.program.state_dict[spec.target]
            else:
                out[node] = self.program.constants[spec.target]
        return out

    def _fold(self, placeholders: dict) -> dict:
        """Nodes that read no placeholder but torch's lifted constants, evaluated by torch
        (``arange``, masks, a sliding window's size, ...)."""
        torch = self.torch
        folded: dict = {}
        specs = self.program.graph_signature.input_specs
        nodes = [n for n in self.graph.nodes if n.op == "placeholder"]
        for node, spec in zip(nodes, specs):
            tensor = placeholders[node]
            if spec.kind.name == "CONSTANT_TENSOR" and tensor.device.type != "meta":
                folded[node] = tensor
        for node in self.graph.nodes:
            if node.op != "call_function" or str(node.target) in _aten.CHECKS:
                continue
            inputs = node.all_input_nodes
            if all(n in folded for n in inputs):
                args = torch.fx.node.map_arg(node.args, lambda n: folded[n])
                kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: folded[n])
                if "device" in kwargs:  # a module on the meta device still folds real values
                    kwargs = {**kwargs, "device": torch.device("cpu")}
                with torch.no_grad():
                    folded[node] = node.target(*args, **kwargs)
        return folded

    def run(self, name: str) -> tuple[Function, list[np.ndarray | None]]:
        placeholders = self._placeholder_arrays()
        folded = self._fold(placeholders)
        specs = self.program.graph_signature.input_specs
        b = FunctionBuilder(name)
        values: dict = {}
        arguments: list[np.ndarray | None] = []
        taken: set[str] = set()

        def declare(node, label: str, tensor) -> None:
            hint = label
            k = 1
            while hint in taken:
                hint, k = f"{label}_{k}", k + 1
            taken.add(hint)
            try:
                dtype = self.dtype(node)
            except _aten.Unsupported as e:
                raise TorchImportError(
                    f"{self.label}: input {hint!r} has {e}, which DistIR has no dtype for "
                    f"(one of {', '.join(_DTYPES)}); convert the module first"
                ) from None
            values[node] = b.input(hint, TensorType(tuple(tensor.shape), dtype, self.device))
            arguments.append(self.array(tensor))

        nodes = [n for n in self.graph.nodes if n.op == "placeholder"]
        user_nodes = [n for n, spec in zip(nodes, specs) if spec.kind.name == "USER_INPUT"]
        # A constant never has the batch's leading size (a coincidence: Swin's strided-slice
        # indices at a batch of as many rows): it gets a leading 1, reshaped away where it
        # is read, so that the transforms never take it for a batch input. (A buffer may
        # hold batch data, a loss's targets: it keeps its shape.)
        batch = next(
            (
                placeholders[n].shape[0]
                for n in user_nodes
                if placeholders[n].dim() and placeholders[n].shape[0] > 1
            ),
            None,
        )

        def unbatched(x: Value, shape: tuple[int, ...]) -> Value:
            return b.call("Reshape", x, shape=shape) if x.type.shape != shape else x

        for node, spec in zip(nodes, specs):
            if spec.kind.name != "USER_INPUT" and node not in folded:  # folded: as computed
                declare(node, weight_name(spec.target or node.name), placeholders[node])

        def lift(array: np.ndarray, label: str) -> Value:
            hint = f"const_{label}"
            k = 1
            while hint in taken:
                hint, k = f"const_{label}_{k}", k + 1
            taken.add(hint)
            shape = tuple(array.shape)
            if shape and shape[0] == batch:
                array = array[None]
            arguments.append(array)
            x = b.input(hint, TensorType(array.shape, DType.from_numpy(array.dtype), self.device))
            return unbatched(x, shape)

        lowering = _aten.Lowering(b, values, self.dtype, self.device, lift)
        lowering.moe_capacity_factor = self.moe_capacity_factor
        lowering.parameters = {
            node for node, spec in zip(nodes, specs) if spec.kind.name == "PARAMETER"
        }
        live_consts = self._lifted(folded)
        for node in user_nodes:
            declare(node, node.name, placeholders[node])
        for node in live_consts:
            tensor = folded[node]
            if tensor.numel() and bool((tensor == tensor.reshape(-1)[0]).all()):
                continue  # uniform: a Constant op where it is read
            block = _repeated_block(tensor)
            if block is not None:  # rows repeated: the block, repeated where it is read
                # (with a leading 1, so that no block is taken for a batch input)
                rows = tensor[:1] if block == 1 else tensor[:block].unsqueeze(0)
                declare(node, f"const_{node.name}", rows)
                values[node] = _repeat_rows(b, values[node], tuple(tensor.shape))
                continue
            shape = tuple(tensor.shape)
            declare(node, f"const_{node.name}", tensor[None] if shape[:1] == (batch,) else tensor)
            values[node] = unbatched(values[node], shape)
        for node in live_consts:
            if node not in values:
                tensor = folded[node]
                first = tensor.reshape(-1)[0].item() if tensor.numel() else 0
                values[node] = lowering.constant(first, self.dtype(node), tuple(tensor.shape))
        problems = self._lower(lowering, values, folded)
        if problems:
            raise UnsupportedOpsError(self.label, problems, self.notes)
        outputs = self._outputs(values, lowering)
        return drop_broadcasts(fold_batched_matmuls(verify(b.finish(outputs)))), arguments

    def _lifted(self, folded: dict) -> list:
        """Folded nodes that a computed node (or the output) reads, in graph order."""
        read = set()
        for node in self.graph.nodes:
            if node in folded or node.op == "placeholder":
                continue
            read.update(n for n in node.all_input_nodes if n in folded)
        return [n for n in self.graph.nodes if n in read]

    def _lower(self, lowering: _aten.Lowering, values: dict, folded: dict) -> dict:
        counts: Counter = Counter()
        where: dict[str, str] = {}
        poisoned: set = set()
        for node in self.graph.nodes:
            if node.op != "call_function" or node in folded or node in values:
                continue
            target = str(node.target)
            if target in _aten.CHECKS:
                continue
            if any(n in poisoned for n in node.all_input_nodes):
                poisoned.add(node)  # its operand's type is unknown: reported at the cause
                continue
            try:
                values[node] = self._lower_one(lowering, node, target, values)
                continue
            except _aten.Unsupported as e:
                key = target if not str(e) else f"{target} ({e})"
            except DistIRError as e:  # a registry op refused the operands: say which
                key = f"{target} (a registry op refused it: {e})"
            counts[key] += 1
            where.setdefault(key, _source_line(node))
            # later nodes are still lowered, on a placeholder of the type torch recorded
            placeholder = self._placeholder(lowering.b, node)
            if placeholder is None:
                poisoned.add(node)
            else:
                values[node] = placeholder
        return {k: (counts[k], where[k]) for k in counts}

    def _placeholder(self, b: FunctionBuilder, node):
        """A stand-in input of ``node``'s recorded type(s), or None when it has none."""
        val = node.meta.get("val")
        items = val if isinstance(val, (tuple, list)) else [val]
        out = []
        for k, item in enumerate(items):
            key = str(getattr(item, "dtype", None))
            if not hasattr(item, "shape") or key not in _DTYPES:
                out.append(None)
                continue
            shape = tuple(int(d) for d in item.shape)
            t = TensorType(shape, _DTYPES[key], self.device)
            out.append(b.input(f"unread_{node.name}_{k}", t))
        if isinstance(val, (tuple, list)):
            return tuple(out)
        return out[0]

    def _lower_one(self, lowering, node, target: str, values: dict):
        if target == "<built-in function getitem>":
            parts, index = values[node.args[0]], node.args[1]
            if parts[index] is None:
                raise _aten.Unsupported(f"result {index} of {node.args[0].target}")
            return parts[index]
        fn = _aten.TABLE.get(target)
        if fn is None:
            raise _aten.Unsupported("")
        return fn(lowering, node)

    def _outputs(self, values: dict, lowering: _aten.Lowering) -> list:
        (output,) = [n for n in self.graph.nodes if n.op == "output"]
        specs = self.program.graph_signature.output_specs
        outs = []
        for node, spec in zip(output.args[0], specs):
            if spec.kind.name != "USER_OUTPUT":
                raise TorchImportError(
                    f"{self.label}: the program writes {spec.kind.name.lower()} "
                    f"{spec.target!r}; export it in eval mode (no state updates)"
                )
            if node is None:
                continue  # an output torch keeps as None (an absent optional tensor)
            if not hasattr(node, "op"):  # a number the forward returns
                outs.append(lowering.value(node))
                continue
            outs.append(values[node])
        return outs
