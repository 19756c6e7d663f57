"""Phase 1 of propagation: a desired layout for every value.

User annotations are fixed. Sweeps forward (operands first) and backward
(results first) through the ops' sharding rules read, per mesh axis, which
factor a known value's ``S(i)`` names (or a Partial passing through a linear
op, or a halo axis), and give the unknown operands and results of the op the
placements that strategy implies (operands are never made Partial). Values no
rule reaches are replicated; a layout that does not fit a value's shape falls
back to ``R`` on the offending axes.
"""

from __future__ import annotations

import functools

from ..function import Function
from ..value import Value
from .annotations import shape_of
from .facts import ProgramFacts
from .mesh import Layout, Mesh, Partial, Placement, R, Shard, shape_fits
from .rules import Rule, placements_for


def _axis_choice(rule: Rule, known_in, known_out, k: int, results_first: bool):
    def from_operands():
        for i, ps in known_in:
            p = ps[k]
            if (h := _is_halo(rule, p, i, "operand", "axis")) is not None:
                return h
            if isinstance(p, Shard) and rule.operands[i][p.dim] is not None:
                return _shard(rule.operands[i][p.dim], p)
            if isinstance(p, Partial) and p.op in rule.partial_ops:
                for members in rule.linear:
                    if i in members:
                        return ("partial", members, p.op)
        return None

    def from_results():
        for j, ps in known_out:
            p = ps[k]
            if j == 0 and (h := _is_halo(rule, p, j, "result", "result_axis")) is not None:
                return h
            if isinstance(p, Shard) and rule.results[j][p.dim] is not None:
                return _shard(rule.results[j][p.dim], p)
            if isinstance(p, Partial):
                for f, op in rule.reduce.items():
                    if op == p.op and f not in rule.results[j]:
                        return ("shard", f)
        return None

    order = (from_results, from_operands) if results_first else (from_operands, from_results)
    for source in order:
        choice = source()
        if choice is not None:
            return choice
    return ("replicate",)


def _shard(factor, p: Shard) -> tuple:
    """The choice splitting ``factor`` as ``p`` splits its axis (fixed blocks kept)."""
    return ("shard", factor) if p.block is None else ("shard", factor, p.block)


def _is_halo(
    rule: Rule, p: Placement, index: int, which: str, axis_key: str
) -> tuple[str, int] | None:
    """The halo choice that splits ``p``'s axis, if ``p`` is one of the rule's window axes."""
    if rule.halo is None or not isinstance(p, Shard):
        return None
    for i, h in enumerate(rule.halo):
        if p.dim == h[axis_key] and (which == "result" or index == h["operand"]):
            return ("halo", i)
    return None


def desired_layouts(
    function: Function,
    fixed: dict[Value, Layout],
    mesh: Mesh,
    facts: ProgramFacts | None = None,
) -> dict[Value, tuple[Placement, ...]]:
    """A placement per value of ``function``: ``fixed``'s, then what the sweeps imply (see
    the module doc). ``facts``: the function's rules, kept by a caller that propagates it
    again (the same for every mesh); a fresh ProgramFacts when None."""
    desired: dict[Value, tuple[Placement, ...]] = {v: lay.placements for v, lay in fixed.items()}
    ops = [op for op in function.ops if op.op_type != "ShardAnnotate"]
    if facts is None:
        facts = ProgramFacts(function)
    rules = facts.rules(ops)
    # An op's placements follow from its rule, its known values' placements and the sweep's
    # direction: a repeated layer asks the same question per layer.
    answers: dict[tuple, tuple | None] = {}
    pending = ops  # ops with a value still unplaced (placed values stay placed)
    for _ in range(2 * len(ops) + 2):
        changed = False
        for backward in (False, True):
            for op in reversed(pending) if backward else pending:
                if all(v in desired for v in op.inputs) and all(v in desired for v in op.outputs):
                    continue
                rule = rules[op]
                known_in = tuple([(i, desired[v]) for i, v in enumerate(op.inputs) if v in desired])
                known_out = tuple(
                    [(j, desired[v]) for j, v in enumerate(op.outputs) if v in desired]
                )
                if not (known_in or known_out):
                    continue
                key = (id(rule), known_in, known_out, backward)  # ``rules`` keeps them alive
                if key in answers:
                    pl = answers[key]
                else:
                    pl = answers[key] = _placements(rule, known_in, known_out, backward, mesh)
                if pl is None:
                    continue
                ins, outs = pl
                for i, v in enumerate(op.inputs):
                    if v not in desired:
                        desired[v] = _fitted(tuple(shape_of(v)), ins[i], mesh.shape)
                        changed = True
                for j, v in enumerate(op.outputs):
                    if v not in desired:
                        desired[v] = _fitted(tuple(shape_of(v)), outs[j], mesh.shape)
                        changed = True
            pending = [
                op
                for op in pending
                if not all(v in desired for v in op.inputs)
                or not all(v in desired for v in op.outputs)
            ]
        if not changed:
            break
    return desired


def _placements(rule: Rule, known_in, known_out, backward: bool, mesh: Mesh):
    """The operands' and results' placements the known ones imply (operands never Partial),
    or None when the implied strategy is invalid."""
    strategy = [_axis_choice(rule, known_in, known_out, k, backward) for k in range(mesh.ndim)]
    pl = placements_for(rule, strategy)
    if pl is None:
        return None
    ins, outs = pl
    ins = [tuple(R if isinstance(p, Partial) else p for p in ps) for ps in ins]
    return ins, [tuple(ps) for ps in outs]


@functools.lru_cache(maxsize=1 << 12)
def _fitted(
    shape: tuple[int, ...], ps: tuple[Placement, ...], mesh_shape: tuple[int, ...]
) -> tuple[Placement, ...]:
    """``ps``, with ``R`` on the offending axes (first to last) until ``shape`` fits; all
    ``R`` if it never does. Memoised (by the mesh's shape): layers ask alike."""
    out = list(ps)
    for k in range(len(out)):
        if shape_fits(shape, mesh_shape, tuple(out)):
            break
        if isinstance(out[k], Shard):
            out[k] = R
    if not shape_fits(shape, mesh_shape, tuple(out)):
        out = [R] * len(mesh_shape)
    return tuple(out)
