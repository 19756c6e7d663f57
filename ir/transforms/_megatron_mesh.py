"""The device mesh of one pipeline stage of :func:`ir.transforms.megatron` and the levels
planned on it.

A stage's ``dp * cp * tp`` devices are numbered as Megatron-Core numbers ranks: tensor
ranks adjacent, then context ranks, then data-parallel replicas, whose expert groups
are ``ep`` consecutive replicas (expert parallelism inside data parallelism). Position
``((g * ep + e) * cp + c) * tp + j`` of a stage's device tuple is expert-data replica
``g``, expert rank ``e``, context rank ``c``, tensor rank ``j``. A group of mesh axes
(``"tp"``, ``"cp"``, ``"ep"``, ``"edp"``, ``"dp"`` for ``edp`` and ``ep`` together) is
every set of positions that differ in those axes only, members in row-major order.
"""

from __future__ import annotations

import itertools

from ..value import Value
from ._megatron_levels import Level, expert_level
from ._spmd import P, R, S, Shard

MESH = ("edp", "ep", "cp", "tp")
AXES = {
    "tp": ("tp",),
    "cp": ("cp",),
    "ep": ("ep",),
    "edp": ("edp",),
    "dp": ("edp", "ep"),
    "dpcp": ("edp", "ep", "cp"),
    "edpcp": ("edp", "cp"),
}


class StageMesh:
    """Groups of a stage's device tuple and the levels between the data and tensor plans
    (mixed into ``MegatronPlan``; reads its ``dp``, ``ep``, ``cp``, ``tp``)."""

    dp: int
    ep: int
    cp: int
    tp: int
    _groups: dict[tuple[str, ...], list[list[int]]]

    def groups(self, level: str) -> list[list[int]]:
        """The positions of each group of ``level`` (a key of :data:`AXES`), made once."""
        axes = AXES[level]
        found = self._groups.get(axes)
        if found is None:
            sizes = {"edp": self.dp // self.ep, "ep": self.ep, "cp": self.cp, "tp": self.tp}
            out: dict[tuple[int, ...], list[int]] = {}
            for g, e, c, j in itertools.product(*(range(sizes[a]) for a in MESH)):
                position = ((g * self.ep + e) * self.cp + c) * self.tp + j
                key = tuple(x for a, x in zip(MESH, (g, e, c, j)) if a not in axes)
                out.setdefault(key, []).append(position)
            found = self._groups[axes] = list(out.values())
        return found

    def tp_groups(self) -> list[list[int]]:
        return self.groups("tp")

    def dp_groups(self) -> list[list[int]]:
        return self.groups("dp")

    def group_size(self, level: str) -> int:
        sizes = {"edp": self.dp // self.ep, "ep": self.ep, "cp": self.cp, "tp": self.tp}
        n = 1
        for a in AXES[level]:
            n *= sizes[a]
        return n

    # -- levels ------------------------------------------------------------------------------

    def _plan_levels(self, stage_of_piece: dict) -> dict:
        """Plan the context and expert levels of the piece (``_megatron_levels``) and put
        the piece, its maps and the stages of its ops in terms of the last level's local
        program; ``self.links`` are the inputs their conversions make."""
        if self.cp == 1 and self.ep == 1:
            return stage_of_piece
        from ._megatron_plan import VAR

        f = self.piece
        value_of: dict[Value, Value] = {v: v for v in f.inputs}
        for op in f.ops:
            value_of.update({v: v for v in op.outputs})
        origin = {op: op for op in f.ops}
        batch = {p for p in f.inputs if self.dplan.state.get(self.source_of[p]) not in (R, None)}
        links: dict = {}
        levels: list[Level] = []
        if self.cp > 1:
            from ._megatron_context import context_level

            levels.append(context_level(self, f, batch, links, VAR))
        if self.ep > 1:
            level = levels[-1] if levels else None
            g = level.function if level else f
            lnk = level.links if level else links
            bt = {level.value_of[p] for p in batch} if level else batch
            levels.append(expert_level(g, self.ep, bt, lnk, VAR, self._finish_expert))
        outputs = list(f.outputs)
        for level in levels:
            value_of = {v: level.value_of[x] for v, x in value_of.items() if x in level.value_of}
            origin = {new: origin[old] for new, old in level.origin.items() if old in origin}
        last = levels[-1]
        value_of.update(zip(outputs, last.function.outputs))  # as returned (gathered, say)
        self.source_of = {value_of[p]: k for p, k in self.source_of.items()}
        self.key_of = {value_of[v]: k for v, k in self.key_of.items() if v in value_of}
        self.summed = {value_of[v] for v in self.summed}
        self.piece = last.function
        self.piece_out = list(dict.fromkeys(self.piece.outputs))
        self.links = last.links
        self.experts = set(getattr(levels[-1], "experts", ())) if self.ep > 1 else set()
        for level in levels:
            self.level_states[level.name] = dict(zip(self.piece.outputs, level.out_states))
        return {new: stage_of_piece[old] for new, old in origin.items()}

    def _finish_expert(self, index: int, v: Value, state: Shard) -> Shard | None:
        """At the end of the expert level: a summed output split over the group that is not
        an expert weight's gradient (``(E, ...)``, split by experts as its weight) is
        gathered; batch-shaped outputs stay split by rows."""
        if self.piece_out[index] not in self.summed or state.kind != "S":
            return None
        if state.dim == 0 and v.type.rank >= 3:  # type: ignore[union-attr]
            return None
        return R

    def _finish_context(self, index: int, v: Value, state: Shard) -> Shard | None:
        """At the end of the context level: a summed output split along the sequence (a
        position table's gradient, by rows) is gathered: weights are whole over the group."""
        if self.piece_out[index] in self.summed and state.kind == "S":
            return R
        return None

    def level_state(self, level: str, piece_value: Value) -> Shard:
        """The state over ``level``'s group of a piece output (``R`` without the level)."""
        return self.level_states.get(level, {}).get(piece_value, R)

    def grad_level(self, piece_value: Value) -> str:
        """The group over which a weight gradient (a piece output) is summed: the data
        replicas, but only those holding the same experts for an expert weight's (split
        over the expert group) or one the expert level has summed already, and the
        context ranks where it is a partial sum over them."""
        cp = self.level_state("cp", piece_value) == P
        if self.ep > 1 and self.level_state("ep", piece_value) != P:
            return "edpcp" if cp else "edp"
        return "dpcp" if cp else "dp"

    def weight_layout(
        self, dp_level: str, tp_level: str, group: str, ep_state: str = "R"
    ) -> tuple[str, ...]:
        """Layout levels of a weight (or its optimizer state) on a stage whose gradient
        ``group`` sums: ``dp_level`` over that group's replicas (``R`` or ZeRO's
        ``S(k)``), ``ep_state`` over the expert group if the group leaves it out (``S(0)``
        for an expert weight), the context ranks alike if the group spans them, the tensor
        ranks' ``tp_level`` last."""
        cp_state = dp_level if group.endswith("cp") else "R"
        if group.startswith("edp"):
            out: tuple[str, ...] = (f"{dp_level}@{self.dp // self.ep}", f"{ep_state}@{self.ep}")
        else:
            out = (f"{dp_level}@{self.dp}",)
        if self.cp > 1:
            out += (f"{cp_state}@{self.cp}",)
        return (*out, tp_level)

    def batch_layout(self, tp_level: str, output: Value | None = None) -> tuple[str, ...]:
        """Layout of a batch input or output (the piece's ``output``): microbatches, then
        replicas and, with context parallelism, each sequence's zigzag chunks
        (``_megatron_context``; an output not split along the sequence, a weight a
        one-piece step updates, as it is over the context ranks)."""
        cp: tuple[str, ...] = ()
        if self.cp > 1:
            state = S(1) if output is None else self.level_state("cp", output)
            cp = (f"Z({state.dim})@{self.cp}" if state.kind == "S" else f"{state}@{self.cp}",)
        return ("S(0)", f"S(0)@{self.dp}", *cp, tp_level)


__all__ = ["AXES", "MESH", "S", "StageMesh"]
