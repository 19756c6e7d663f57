"""Keeping graphviz's work small: which edges of a drawing are too long to draw whole.

dot routes an edge through one virtual node per rank it crosses and positions
them all with network simplex; a training program's weights and saved
activations, read again far below where they are made, are what makes a big
drawing slow. The graph view starts such edges at a stub next to their reader.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .graph import GraphOptions


def long_edges(edges: list[tuple[str, str]], options: GraphOptions) -> set[tuple[str, str]]:
    """Edges spanning more than ``options.max_edge_ranks`` ranks (longest-path ranks;
    a node nothing points to sits just above its nearest reader), in drawings of more
    than ``options.stub_above_nodes`` nodes. dot routes a long edge through one
    virtual node per rank it crosses: a training program's weights and saved
    activations, read again far below, made 13 000 of them and 30 s of layout."""
    limit = options.max_edge_ranks
    nodes = dict.fromkeys(n for e in edges for n in e)
    if limit is None or len(nodes) <= options.stub_above_nodes:
        return set()
    preds: dict[str, list[str]] = {n: [] for n in nodes}
    succs: dict[str, list[str]] = {n: [] for n in nodes}
    for s, t in edges:
        preds[t].append(s)
        succs[s].append(t)
    roots = {n for n in nodes if not preds[n]}
    rank: dict[str, int] = {}
    waiting = {n: sum(p not in roots for p in preds[n]) for n in nodes if n not in roots}
    ready = [n for n, k in waiting.items() if k == 0]
    while ready:
        n = ready.pop()
        rank[n] = max((rank[p] + 1 for p in preds[n] if p not in roots), default=0)
        for t in succs[n]:
            waiting[t] -= 1
            if waiting[t] == 0:
                ready.append(t)
    if len(rank) < len(waiting):
        return set()  # not a DAG (cannot happen for a verified program): draw every edge
    for n in roots:
        rank[n] = min((rank.get(t, 1) for t in succs[n]), default=1) - 1
    return {(s, t) for s, t in edges if rank[t] - rank[s] > limit}
