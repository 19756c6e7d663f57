"""A program's facts (rules, op signatures: ``ProgramFacts``) and the memoised desired-layout
sweeps change no answer: they equal a plain sweep that asks every rule afresh, for any mesh.
One facts object reads each rule once over many propagations; nothing is kept between
propagations that are not given one."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import ir
import ir.models
import ir.registry as registry
import ir.sharding.facts as facts_module
from ir import FunctionBuilder, TensorType
from ir.errors import ArgumentError
from ir.sharding import Layout, Mesh, ProgramFacts, R, S, propagate
from ir.sharding import annotations as ann
from ir.sharding.desired import _axis_choice, desired_layouts
from ir.sharding.errors import AnnotationError, PropagationError
from ir.sharding.mesh import Partial
from ir.sharding.rules import axis_placements, placements_for, rule_for, strategies
from ir.verify import hashed_key


def plain_desired(function, fixed, mesh):
    """The sweeps without memos: every op asks its rule each time (the reference)."""
    desired = {v: lay.placements for v, lay in fixed.items()}
    ops = [op for op in function.ops if op.op_type != "ShardAnnotate"]
    for _ in range(2 * len(ops) + 2):
        changed = False
        for backward in (False, True):
            for op in reversed(ops) if backward else ops:
                if all(v in desired for v in (*op.inputs, *op.outputs)):
                    continue
                rule = rule_for(op)
                known_in = [(i, desired[v]) for i, v in enumerate(op.inputs) if v in desired]
                known_out = [(j, desired[v]) for j, v in enumerate(op.outputs) if v in desired]
                if not (known_in or known_out):
                    continue
                strategy = [
                    _axis_choice(rule, known_in, known_out, k, backward) for k in range(mesh.ndim)
                ]
                pl = plain_placements(rule, strategy)
                if pl is None:
                    continue
                for v, ps, is_input in [
                    *((v, pl[0][i], True) for i, v in enumerate(op.inputs)),
                    *((v, pl[1][j], False) for j, v in enumerate(op.outputs)),
                ]:
                    if v in desired:
                        continue
                    if is_input:
                        ps = tuple(R if isinstance(p, Partial) else p for p in ps)
                    desired[v] = fitted(ann.shape_of(v), list(ps), mesh)
                    changed = True
        if not changed:
            break
    return desired


def plain_placements(rule, strategy):
    """``placements_for`` without its memos."""
    per_axis = [axis_placements(rule, c) for c in strategy]
    if any(p is None for p in per_axis):
        return None
    ins = [tuple(p[0][i] for p in per_axis) for i in range(len(rule.operands))]
    outs = [tuple(p[1][j] for p in per_axis) for j in range(len(rule.results))]
    return ins, outs


def fitted(shape, out, mesh):
    for k in range(len(out)):
        try:
            Layout(mesh, out).check(shape)
            break
        except AnnotationError:
            if isinstance(out[k], S):
                out[k] = R
    try:
        Layout(mesh, out).check(shape)
    except AnnotationError:
        out = [R] * mesh.ndim
    return tuple(out)


@pytest.mark.parametrize("training", [False, True])
def test_desired_layouts_equal_a_plain_sweep_on_every_mesh(training):
    f = ir.models.gpt(batch=6, seq=8, hidden=12, heads=2, vocab=30, layers=3, training=training)
    cases = [
        ((2,), [S(0)]),
        ((4,), [S(1)]),
        ((3,), [S(0)]),  # uneven: 6 rows and 8 columns over 3
        ((2, 2), [S(0), R]),
        ((2, 3), [R, S(1)]),
        ((4, 2), [S(0), S(1)]),  # 12 hidden over 4 then heads 2 over ...: some fall back to R
        ((2, 2, 2), [S(0), R, S(1)]),
    ]
    for shape, placements in cases:
        fixed, mesh = ann.collect(f, {"tokens": (Mesh(shape), placements)}, None)
        assert desired_layouts(f, fixed, mesh) == plain_desired(f, fixed, mesh), shape


def counted_rule_reads(monkeypatch) -> list:
    """The ops whose rule ProgramFacts reads from the registry (``rule_for``), in order."""
    reads: list = []

    def counted(op, *args, **kwargs):
        reads.append(op)
        return rule_for(op, *args, **kwargs)

    monkeypatch.setattr(facts_module, "rule_for", counted)
    return reads


def counted_signature_keys(monkeypatch) -> list:
    """The signature keys ProgramFacts hashes (one per op without a body), in order."""
    keys: list = []

    def counted(key):
        keys.append(key)
        return hashed_key(key)

    monkeypatch.setattr(facts_module, "hashed_key", counted)
    return keys


def small_gpt(layers: int = 2, training: bool = False) -> ir.Function:
    return ir.models.gpt(
        batch=4, seq=8, hidden=16, heads=2, vocab=32, layers=layers, training=training
    )


def data_parallel(f: ir.Function, shape: tuple[int, ...]):
    return {"tokens": (Mesh(shape), [S(0)] + [R] * (len(shape) - 1))}


def test_rules_are_rule_for_kept_per_facts_and_reread_after_a_registry_change(monkeypatch):
    f = ir.models.gpt(batch=2, seq=4, hidden=8, heads=2, vocab=16, layers=2)
    ops = list(f.ops)
    facts = ProgramFacts(f)
    rules = facts.rules(ops)
    assert list(rules) == ops and all(rules[op] == rule_for(op) for op in ops)
    again = facts.rules(ops)
    assert all(again[op] is rules[op] for op in ops)  # from the facts object
    # A new record for MatMul (another sharding rule): its ops' rules are read afresh.
    matmul = registry.get_op("MatMul")

    def replicated_only(ctx):
        rule = matmul.sharding_rule(ctx)
        return {**rule, "operands": [[None] * len(o) for o in rule["operands"]]}

    changed = dataclasses.replace(matmul, sharding_rule=replicated_only)
    monkeypatch.setitem(registry._LOOKUP, "matmul", changed)
    monkeypatch.setitem(registry._REGISTRY, "MatMul", changed)
    fresh = facts.rules(ops)
    for op in ops:
        if op.op_type == "MatMul":
            assert fresh[op] != rules[op]
            assert all(f is None for o in fresh[op].operands for f in o)
        else:
            assert fresh[op] is rules[op]


def test_rules_raise_rule_for_error_at_the_first_op_without_a_rule(monkeypatch):
    f = ir.models.gpt(batch=2, seq=4, hidden=8, heads=2, vocab=16, layers=1)
    bare = dataclasses.replace(registry.get_op("Gelu"), sharding_rule=None)
    monkeypatch.setitem(registry._LOOKUP, "gelu", bare)
    first = next(op for op in f.ops if op.op_type == "Gelu")
    with pytest.raises(PropagationError) as want:
        rule_for(first)
    with pytest.raises(PropagationError) as got:
        ProgramFacts(f).rules(list(f.ops))
    assert str(got.value) == str(want.value)


def test_signatures_name_equal_ops_alike_and_others_apart():
    b = FunctionBuilder("f")
    x = b.input("x", TensorType((4, 6), device=0))
    w = b.input("w", TensorType((6, 6), device=0))
    y1 = b.call("MatMul", x, w, name="y1")
    y2 = b.call("MatMul", y1, w, name="y2")  # the same types: the same signature
    y3 = b.call("Transpose", y2, perm=[1, 0], name="y3")
    y4 = b.call("Transpose", y3, perm=(1, 0), name="y4")  # a tuple, not a list: apart
    y5 = b.call("Mul", y4, y4, name="y5")  # another op type
    f = b.finish([y5])
    facts = ProgramFacts(f)
    s = facts.signatures()
    a, c, t1, t2, m = (s[op] for op in f.ops)
    assert a == c and isinstance(a, int)
    assert len({a, t1, t2, m}) == 4
    assert facts.signatures() is s  # computed once per facts object


def test_signatures_are_none_for_unhashable_attributes(monkeypatch):
    b = FunctionBuilder("f")
    x = b.input("x", TensorType((2, 2), device=0))
    y = b.call("Relu", x, name="y")
    f = b.finish([y])
    op = f.ops[0]
    odd = dataclasses.replace(op)
    object.__setattr__(odd, "attributes", {"table": np.zeros(2)})
    g = dataclasses.replace(f, ops=(odd,))
    assert ProgramFacts(g).signatures()[odd] is None
    assert isinstance(ProgramFacts(f).signatures()[op], int)


def test_one_facts_object_reads_each_rule_and_signature_once_over_propagations(monkeypatch):
    f = small_gpt()
    reads = counted_rule_reads(monkeypatch)
    keys = counted_signature_keys(monkeypatch)
    facts = ProgramFacts(f)
    g2, _ = propagate(f, data_parallel(f, (2,)), facts=facts)
    assert sorted(map(id, reads)) == sorted(map(id, f.ops))  # every op's rule, once
    assert len(keys) == len(f.ops)  # (no op has a body)
    del reads[:], keys[:]
    g4, _ = propagate(f, data_parallel(f, (2, 2)), facts=facts)
    assert reads == [] and keys == []  # another mesh: nothing read again
    assert str(g4) == str(propagate(f, data_parallel(f, (2, 2)))[0])
    assert str(g2) == str(propagate(f, data_parallel(f, (2,)))[0])


def test_propagate_keeps_nothing_between_calls_without_a_facts_object(monkeypatch):
    f = small_gpt()
    reads = counted_rule_reads(monkeypatch)
    keys = counted_signature_keys(monkeypatch)
    propagate(f, data_parallel(f, (2,)))
    once = (len(reads), len(keys))
    assert once == (len(f.ops), len(f.ops))
    propagate(f, data_parallel(f, (2,)))  # the same program and mesh: all read again
    assert (len(reads), len(keys)) == (2 * once[0], 2 * once[1])
    for _ in range(2):  # and so does each fresh facts object
        propagate(f, data_parallel(f, (2,)), facts=ProgramFacts(f))
    assert (len(reads), len(keys)) == (4 * once[0], 4 * once[1])


def test_two_programs_do_not_share_facts(monkeypatch):
    f, twin = small_gpt(), small_gpt()  # equal texts, two programs
    assert str(f) == str(twin)
    reads = counted_rule_reads(monkeypatch)
    facts = ProgramFacts(f)
    propagate(f, data_parallel(f, (2,)), facts=facts)
    twin_facts = ProgramFacts(twin)
    propagate(twin, data_parallel(twin, (2,)), facts=twin_facts)
    assert len(reads) == 2 * len(f.ops)
    assert {id(op) for op in reads[len(f.ops) :]} == {id(op) for op in twin.ops}
    assert not set(facts._rules) & set(twin_facts._rules)
    with pytest.raises(ArgumentError) as e:  # one program's facts refused for another
        propagate(twin, data_parallel(twin, (2,)), facts=facts)
    assert "facts were made for the program 'gpt'" in str(e.value)
    assert "pass ProgramFacts(function)" in str(e.value)
    with pytest.raises(ArgumentError, match=r"facts must be an ir\.sharding\.ProgramFacts"):
        propagate(f, data_parallel(f, (2,)), facts={})


def test_a_facts_object_sees_a_registry_change_between_propagations(monkeypatch):
    f = small_gpt(layers=1)
    mesh = {"tokens": (Mesh((2,)), [S(0)]), "h0_mlp_w1": (Mesh((2,)), [S(1)])}
    facts = ProgramFacts(f)
    before, report = propagate(f, mesh, facts=facts)
    assert any("MatMul" in op_text and "split" in how for op_text, how in report.strategies)
    # MatMul's record now splits nothing: the same facts object must not keep the old rule
    matmul = registry.get_op("MatMul")

    def replicated_only(ctx):
        rule = matmul.sharding_rule(ctx)
        return {
            **rule,
            "operands": [[None] * len(o) for o in rule["operands"]],
            "results": [[None] * len(r) for r in rule["results"]],
        }

    changed = dataclasses.replace(matmul, sharding_rule=replicated_only)
    monkeypatch.setitem(registry._LOOKUP, "matmul", changed)
    monkeypatch.setitem(registry._REGISTRY, "MatMul", changed)
    after, report_after = propagate(f, mesh, facts=facts)
    fresh, _ = propagate(f, mesh, facts=ProgramFacts(f))
    assert str(after) == str(fresh) != str(before)
    assert all(
        "split" not in how for op_text, how in report_after.strategies if "MatMul" in op_text
    )


def test_propagate_with_warm_facts_gives_the_answer_a_fresh_function_gets():
    def run(f, shape, facts=None):
        g, report = propagate(f, data_parallel(f, shape), facts=facts)
        return str(g), report.strategies, [str(c) for c in report.collectives]

    f = small_gpt(training=True)
    facts = ProgramFacts(f)
    shapes = [(2,), (2, 2), (4,)]
    for shape in shapes:
        run(f, shape, facts)  # warms f's facts
    for shape in shapes:
        assert run(f, shape, facts) == run(small_gpt(training=True), shape)


def test_placements_for_answers_as_axis_placements_do_on_every_mesh():
    f = ir.models.gpt(batch=4, seq=8, hidden=16, heads=2, vocab=32, layers=1, training=True)
    checked = 0
    for mesh in (Mesh((2,)), Mesh((2, 2)), Mesh((2, 1, 2))):
        for op in f.ops:
            rule = rule_for(op)
            current = [(R,) * mesh.ndim for _ in op.inputs]
            for strategy in strategies(rule, mesh, current):
                want = plain_placements(rule, strategy)
                for _ in range(2):  # computed, then from the rule's memo
                    got = placements_for(rule, strategy)
                    if want is None:
                        assert got is None
                    else:
                        assert [list(x) for x in got] == [list(x) for x in want]
                checked += 1
    assert checked > 500
