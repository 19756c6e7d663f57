"""ONNX ``Einsum`` as transposes, reshapes, sums and batched ``MatMul`` s.

The equation's operands are contracted two at a time, left to right: letters in both
operands and still needed (by the output or a later operand) are batch axes, letters
in both and no longer needed are contracted, the others are each operand's free axes;
a letter in one operand only and needed nowhere else is summed first. Each pair is one
``MatMul`` of ``(batch, free_a, contracted) @ (batch, contracted, free_b)``, so that
the registry's matmul rules (cost, sharding, gradient) apply. A letter repeated within
one operand (a diagonal) is refused.
"""

from __future__ import annotations

import math

from ._onnx_rules import Refused, Rule, attr

_SPARE = "".join(chr(c) for c in range(0x3B1, 0x3C9))  # Greek letters for ellipsis axes


def parse(equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """Each operand's letters and the output's, ellipses spelled out with spare letters."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise Refused(
            f"equation {equation!r} names {len(terms)} operands, the node has {len(ranks)}"
        )
    ellipsis = 0
    spelled = []
    for term, rank in zip(terms, ranks):
        if "..." in term:
            n = rank - (len(term) - 3)
            ellipsis = max(ellipsis, n)
            spelled.append((term, n))
        else:
            if len(term) != rank:
                raise Refused(f"term {term!r} does not fit an operand of rank {rank}")
            spelled.append((term, 0))
    spare = _SPARE[:ellipsis]
    out_terms = [t.replace("...", spare[ellipsis - n :]) for t, n in spelled]
    if arrow:
        output = rhs.replace("...", spare)
    else:
        letters = "".join(out_terms).replace(spare, "") if spare else "".join(out_terms)
        once = sorted(c for c in set(letters) if letters.count(c) == 1 and c not in spare)
        output = spare + "".join(once)
    return out_terms, output


def _sum_out(rd, x, letters: str, keep: set[str]):
    gone = tuple(i for i, c in enumerate(letters) if c not in keep)
    if not gone:
        return x, letters
    x = rd.b.call("ReduceSum", x, axes=gone, keepdims=False, name="summed")
    return x, "".join(c for c in letters if c in keep)


def _arranged(rd, x, letters: str, order: str):
    perm = tuple(letters.index(c) for c in order)
    if perm != tuple(range(len(perm))):
        x = rd.b.call("Transpose", x, perm=perm, name="arranged")
    return x


def _broadcast(rd, x, letters: str, sizes: dict[str, int]):
    want = tuple(sizes[c] for c in letters)
    if x.type.shape != want:
        x = rd.b.call("BroadcastTo", x, shape=want, name="broadcast")
    return x


def _pair(rd, a, la: str, b, lb: str, keep: set[str]):
    sizes = {
        c: max(
            a.type.shape[la.index(c)] if c in la else 1, b.type.shape[lb.index(c)] if c in lb else 1
        )
        for c in set(la) | set(lb)
    }
    batch = "".join(c for c in la if c in lb and c in keep)
    contracted = "".join(c for c in la if c in lb and c not in keep)
    free_a = "".join(c for c in la if c not in lb)
    free_b = "".join(c for c in lb if c not in la)
    a = _broadcast(
        rd, _arranged(rd, a, la, batch + free_a + contracted), batch + free_a + contracted, sizes
    )
    b = _broadcast(
        rd, _arranged(rd, b, lb, batch + contracted + free_b), batch + contracted + free_b, sizes
    )

    def n(letters: str) -> int:
        return math.prod(sizes[c] for c in letters)

    a = rd.b.call("Reshape", a, shape=(n(batch), n(free_a), n(contracted)), name="rows")
    b = rd.b.call("Reshape", b, shape=(n(batch), n(contracted), n(free_b)), name="columns")
    y = rd.b.call("MatMul", a, b, name="contracted")
    letters = batch + free_a + free_b
    y = rd.b.call("Reshape", y, shape=tuple(sizes[c] for c in letters), name="product")
    return y, letters


def _einsum(rd, node):
    xs = rd.inputs(node)
    terms, output = parse(attr(rd, node, "equation"), [x.type.rank for x in xs])
    for t in terms:
        if len(set(t)) != len(t):
            raise Refused(f"term {t!r} repeats a letter (a diagonal)")
    operands = list(zip(xs, terms))
    x, letters = operands[0]
    later = lambda k: set(output).union(*(t for _, t in operands[k:]))  # noqa: E731
    x, letters = _sum_out(rd, x, letters, later(1))
    for k in range(1, len(operands)):
        y, ly = operands[k]
        y, ly = _sum_out(rd, y, ly, later(k + 1) | set(letters))
        x, letters = _pair(rd, x, letters, y, ly, later(k + 1))
    x, letters = _sum_out(rd, x, letters, set(output))
    perm = tuple(letters.index(c) for c in output)
    if perm == tuple(range(len(perm))):
        return [rd.call("Identity", x)]
    return [rd.call("Transpose", x, perm=perm)]


RULES: dict[str, Rule] = {"Einsum": Rule(_einsum)}
