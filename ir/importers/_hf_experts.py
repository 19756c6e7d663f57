"""Hugging Face mixture-of-experts layers made exportable: each experts module one op.

transformers (5.x) stores every MoE family's experts the same way, in a module its
``use_experts_implementation`` decorator marks (``MixtralExperts``, ``Qwen2MoeExperts``,
``Qwen3MoeExperts``, ``OlmoeExperts``, ``DeepseekV3Experts`` and some sixty more): the
fused gate and up projections ``gate_up_proj (E, 2F, H)`` (``(E, H, 2F)`` when the
decorator says ``is_transposed``), the down projection ``down_proj (E, H, F)`` (or
``(E, F, H)``), called as ``experts(x (T, H), top_k_index (T, k), top_k_weights (T, k))``
on the ``T = B * S`` tokens of the block's ``(B, S, H)`` input, and computing for each
token ``sum_j w_j * down_e(silu(gate_e(x)) * up_e(x))`` over its ``k`` choices ``e_j``.
Its implementations (``grouped_mm``, the default) sort the tokens by expert and multiply
groups of data-dependent sizes: ``sort``, ``histc``, ``index_put`` and a grouped product
that a static program cannot hold op by op.

:func:`experts_as_one_op`, used by ``ir.from_torch`` around ``torch.export``, replaces
(on the instance, for the export only) each recognised experts module's ``forward`` by
one call of the custom op ``distir::moe_experts`` (an eager kernel that computes the
same sum, and a shape-only kernel for tracing): the exported graph holds one node per
MoE layer, with the tokens, the router's choices and gates, and the two expert weights
as operands, which ``ir.importers._aten_moe`` translates to the registry's MoE ops. The
router (a ``Linear``, a softmax or a sigmoid, ``topk``, a renormalisation, a shared
expert and its gate) stays what the model writes and is imported op by op.

An experts module is recognised when its decorator's flags say gated, concatenated
``[gate; up]`` weights without biases or a post-expert norm, its ``_apply_gate`` is
transformers' default and its activation is SiLU; each other one keeps its own forward
(so the import lists the ATen ops it needs) and the reason is noted.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import MethodType

import torch

__all__ = ["experts_as_one_op", "moe_experts"]

_SCHEMA = (
    "(Tensor hidden, Tensor index, Tensor weights, Tensor gate_up, Tensor down, "
    "int sequence, bool transposed) -> Tensor"
)


@torch.library.custom_op("distir::moe_experts", mutates_args=(), schema=_SCHEMA)
def moe_experts(
    hidden: torch.Tensor,
    index: torch.Tensor,
    weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    sequence: int,
    transposed: bool,
) -> torch.Tensor:
    """Gated SiLU experts on the tokens ``hidden (T, H)`` (``T / sequence`` sequences of
    ``sequence`` tokens): each token's sum over its choices ``index (T, k)`` of
    ``weights (T, k)`` times ``down_e(silu(g) * u)``, ``[g; u] = gate_up_e(x)``, with
    ``gate_up (E, 2F, H)`` and ``down (E, H, F)`` stored as ``Linear`` weights (``(E, H,
    2F)`` and ``(E, F, H)`` when ``transposed``). Every choice is computed: dropless."""
    out = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    for e in range(gate_up.shape[0]):
        token, choice = torch.where(index == e)
        if token.numel() == 0:
            continue
        w_in, w_out = (gate_up[e], down[e]) if transposed else (gate_up[e].T, down[e].T)
        gate, up = (hidden[token] @ w_in).chunk(2, dim=-1)
        y = (torch.nn.functional.silu(gate) * up) @ w_out
        out.index_add_(0, token, (y * weights[token, choice, None]).float())
    return out.to(hidden.dtype)


@moe_experts.register_fake
def _moe_experts_shape(hidden, index, weights, gate_up, down, sequence, transposed):
    return torch.empty_like(hidden)


def unsupported_reason(experts: torch.nn.Module) -> str:
    """Why ``experts`` (a module transformers' ``use_experts_implementation`` marks) is not
    the gated SiLU experts ``moe_experts`` computes; ``""`` when it is."""
    from transformers.integrations import moe as hf_moe

    flags = {
        "has_gate": True,
        "is_concatenated": True,
        "has_bias": False,
        "has_post_expert_norm": False,
        "_is_expert_parallel": False,
    }
    for flag, want in flags.items():
        if bool(getattr(experts, flag, want)) is not want:
            return f"{flag}={not want} (the importer maps {flag}={want} only)"
    default_gate = getattr(hf_moe, "_default_apply_gate", None)
    if default_gate is None or getattr(type(experts), "_apply_gate", None) is not default_gate:
        return "its own _apply_gate (the importer maps silu(gate) * up only)"
    probe = torch.linspace(-4.0, 4.0, 17)
    act = getattr(experts, "act_fn", None)
    try:
        silu = act is not None and torch.allclose(act(probe), torch.nn.functional.silu(probe))
    except Exception:  # an activation that does not take a plain tensor
        silu = False
    if not silu:
        return f"activation {type(act).__name__} (the importer maps SiLU experts only)"
    gate_up, down = getattr(experts, "gate_up_proj", None), getattr(experts, "down_proj", None)
    if not isinstance(gate_up, torch.Tensor) or not isinstance(down, torch.Tensor):
        return "no gate_up_proj and down_proj tensors"
    if gate_up.dim() != 3 or down.dim() != 3 or gate_up.shape[0] != down.shape[0]:
        return f"weights of shapes {tuple(gate_up.shape)}, {tuple(down.shape)} (want (E, ., .))"
    e, a, b = gate_up.shape
    two_f, hidden = (b, a) if experts.is_transposed else (a, b)
    want = (e, two_f // 2, hidden) if experts.is_transposed else (e, hidden, two_f // 2)
    if two_f % 2 or tuple(down.shape) != want:
        return f"down_proj {tuple(down.shape)} does not match gate_up_proj {tuple(gate_up.shape)}"
    return ""


def _is_hf_experts(m: torch.nn.Module) -> bool:
    """A module transformers' ``use_experts_implementation`` decorated (its flags set)."""
    return "transformers" in type(m).__module__ and hasattr(m, "is_concatenated")


_MISSING = object()


@contextmanager
def experts_as_one_op(module: torch.nn.Module) -> Iterator[list[str]]:
    """Inside the block, every recognised experts module of ``module`` computes through
    ``moe_experts`` (see the module docstring); after it, each is as it was. Yields the
    notes on experts modules left as they are (their path, class and reason), filled in
    while the block runs (a module whose caller passes no ``(B, S, H)`` tensor is noted
    when it is called)."""
    notes: list[str] = []
    parents = dict(module.named_modules())
    restore: list = []
    try:
        for path, experts in parents.items():
            if not _is_hf_experts(experts):
                continue
            label = f"{path or 'the module'} ({type(experts).__name__})"
            reason = unsupported_reason(experts)
            if reason:
                notes.append(f"{label}: {reason}")
                continue
            parent = parents[path.rpartition(".")[0]] if path else None
            if parent is None:
                notes.append(f"{label}: called on its own (its block gives the sequences)")
                continue
            caller: dict[str, tuple[int, ...]] = {}
            hook = parent.register_forward_pre_hook(_recorder(caller), with_kwargs=True)
            saved = experts.__dict__.get("forward", _MISSING)
            experts.forward = MethodType(_one_op_forward(caller, label, notes), experts)
            restore.append((experts, saved, hook))
        yield notes
    finally:
        for experts, saved, hook in restore:
            hook.remove()
            if saved is _MISSING:
                del experts.forward
            else:
                experts.forward = saved


def _recorder(caller: dict):
    """A forward pre-hook that records the shape of the block's first tensor argument."""

    def record(block, args, kwargs):
        first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        caller["shape"] = tuple(first.shape) if first is not None else ()
        return None

    return record


def _one_op_forward(caller: dict, label: str, notes: list[str]):
    """The experts' forward as one ``moe_experts`` call on the block's sequences."""

    def forward(self, hidden_states, top_k_index, top_k_weights):
        shape = caller.get("shape", ())
        tokens = hidden_states.shape[0] if hidden_states.dim() == 2 else -1
        if len(shape) != 3 or shape[0] * shape[1] != tokens:
            notes.append(
                f"{label}: its block's input {shape} is not the (batch, seq, hidden) of its "
                f"{tuple(hidden_states.shape)} tokens"
            )
            return type(self).forward(self, hidden_states, top_k_index, top_k_weights)
        return moe_experts(
            hidden_states,
            top_k_index,
            top_k_weights,
            self.gate_up_proj,
            self.down_proj,
            int(shape[1]),
            bool(self.is_transposed),
        )

    return forward
