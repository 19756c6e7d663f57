"""Prefill and decode steps of a forward program, with the KV cache as explicit state.

A causal language model computes position ``i``'s result from positions ``0 .. i``
only; its one place that mixes positions is attention. So the step that serves ``n``
new tokens after ``past`` cached ones is the forward restricted to the window of
positions ``[past, past + n)``, with each attention's keys and values for ``[0, past)``
read from a cache instead of recomputed:

* ops that work position by position (projections, norms, MLPs, residual adds, the
  head) run on the window's rows only;
* a value with a positions axis that depends on no token (a learned position table, a
  constant) is sliced to the window's positions;
* an op whose record names a ``position_attribute`` (``Rotary``'s ``offset``) gets the
  window's first position there;
* each causal ``Attention(q, k, v)`` appends the window's keys and values to its layer's
  cache (``CacheAppend``) and attends over all ``past + n`` positions: the op's causal
  diagonal is aligned bottom-right, so query ``past + i`` sees keys ``0 .. past + i``.

Which axis of each value holds the positions is read from the ops' sharding rules (the
factor of the token ids' axis 1, followed through every op), so built-in and imported
models are rewritten alike; an op that mixes positions another way (an unfused
attention's ``Softmax`` over keys, a loss summed over tokens that an output needs, an
attention mask) is refused with a :class:`ServingError` naming it.

Every step reads each layer's cache (``past_key_<l>``, ``past_value_<l>``: resident state
on the devices that hold its heads, like a training step's weights) and returns it grown
by the window (``present_key_<l>``, ``present_value_<l>``), the next step's inputs.
``prefill_step(f, P)`` is the window ``[0, P)``: its caches come in with no positions yet
(the engine's allocation, written by the prompt's keys and values), and it returns the
logits of the last position (a serving engine samples the first output token from them;
``logits="all"`` keeps every position). ``decode_step(f, C)`` is the window ``[C, C + 1)``
with caches of ``C`` positions in and ``C + 1`` out. The forward's batch is the number of
sequences, its sequence length the longest context the model serves (its positions).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..builder import FunctionBuilder
from ..errors import DistIRError
from ..function import Function
from ..op import Op
from ..registry import get_op
from ..sharding.errors import PropagationError
from ..sharding.rules import rule_for
from ..types import TensorType, TupleType
from ..value import Value
from ..verify import describe_op

LOGITS = ("last", "all")


class ServingError(DistIRError):
    """A forward program, context or serving strategy that cannot be served as asked."""


@dataclass(frozen=True)
class CacheLayer:
    """One attention layer's cache: ``kv_heads`` heads of ``key_dim`` and ``value_dim``
    channels per position, ``itemsize_bytes`` per element."""

    layer: int
    kv_heads: int
    key_dim: int
    value_dim: int
    itemsize_bytes: int

    @property
    def bytes_per_token(self) -> int:
        """Keys and values of one position of one sequence."""
        return self.kv_heads * (self.key_dim + self.value_dim) * self.itemsize_bytes


@dataclass(frozen=True)
class _Label:
    """What the analysis knows of a value that depends on the tokens: its positions axis
    (None: it summarises every position, made so by ``mixer``) and its batch axis (None:
    it mixes the sequences, or has no batch axis)."""

    axis: int | None
    mixer: Op | None = None
    batch: int | None = None


class _Analysis:
    """Token ids, positions axes and attention layers of a forward program."""

    def __init__(self, f: Function, tokens: str | None) -> None:
        self.f = f
        self.tokens = _token_input(f, tokens)
        self.batch, self.positions = self.tokens.type.shape  # type: ignore[union-attr]
        self.label: dict[Value, _Label] = {self.tokens: _Label(1, batch=0)}
        self.tables: dict[tuple[Op, int], int] = {}  # (op, operand) -> positions axis
        self.batched: list[Value] = []  # token-free values the batch axis runs through
        self.attention: list[Op] = []
        self.passthrough: dict[Op, int] = {}  # ops whose result is one of their operands
        # each attention's (key, value) cache: the value cached and the ops that repeat it
        self.sources: dict[Op, tuple[tuple[Value, tuple[Op, ...]], ...]] = {}
        for op in f.ops:
            if any(v in self.label for v in op.inputs):
                self._label(op)
        # an exported cache (the attention's keys and values as outputs) is the step's own
        cached = {self._same(v) for op in self.attention for v in op.inputs[1:3]}
        cached |= {self._same(src) for pair in self.sources.values() for src, _ in pair}
        kept = [
            v
            for v in f.outputs
            if v in self.label and self.label[v].axis is not None and self._same(v) not in cached
        ]
        mixed = [self.label[v].mixer for v in f.outputs if v in self.label]
        if not kept and any(mixed):
            op = next(op for op in mixed if op is not None)
            raise ServingError(
                f"the outputs of {f.name} ({[v.name for v in f.outputs]}) lose the positions "
                f"axis where {_mixing(op)}\n  in: {describe_op(op)}"
            )
        if not kept:
            raise ServingError(
                f"no output of {f.name} has a result per position (its outputs: "
                f"{[v.name for v in f.outputs]}): serving needs the logits"
            )
        self.outputs = kept
        self.needed = _needed_ops(f, kept)
        for v in (u for op in self.needed for u in op.inputs):
            lab = self.label.get(v)
            if lab is not None and lab.axis is None and lab.mixer is not None:
                raise ServingError(
                    f"{v.name!r} loses the positions axis where {_mixing(lab.mixer)}: a step "
                    f"over new positions cannot compute it\n  in: {describe_op(lab.mixer)}"
                )
        if not self.attention:
            raise ServingError(f"{f.name} has no causal Attention op: there is no KV cache")
        self.layers = [self._layer(i, op) for i, op in enumerate(self.attention)]

    def _label(self, op: Op) -> None:
        opdef = get_op(op.op_type)
        derived = [(i, self.label[v]) for i, v in enumerate(op.inputs) if v in self.label]
        mixed = next((lab for _, lab in derived if lab.axis is None), None)
        if mixed is not None:
            for v in op.outputs:
                self.label[v] = _Label(None, mixed.mixer)
            return
        if opdef.name == "Attention":
            self._attention(op, derived)
            return
        if self._appends_nothing(op, derived):
            return
        if op.op_type == "Dropout" and op.attributes.get("p"):
            raise ServingError(
                f"{self.f.name} has a dropout (p={op.attributes['p']}); serving runs the model "
                f"without it: build it with dropout=0\n  in: {describe_op(op)}"
            )
        position = opdef.extra.get("position_attribute")
        if position is not None:
            ((i, lab),) = derived
            rank = op.inputs[i].type.rank  # type: ignore[union-attr]
            if lab.axis != rank - 2:
                raise ServingError(
                    f"{op.op_type} takes its positions on axis -2 of {op.inputs[i].name!r}, but "
                    f"the sequence runs along axis {lab.axis}\n  in: {describe_op(op)}"
                )
            self.label[op.outputs[0]] = _Label(lab.axis, batch=lab.batch)
            return
        if op.op_type == "Reshape":
            ((_, lab),) = derived
            x, y = op.inputs[0].type, op.outputs[0].type
            axis, batch = (_reshaped(x.shape, y.shape, a) for a in (lab.axis, lab.batch))  # type: ignore[union-attr]
            self.label[op.outputs[0]] = _Label(axis, None if axis is not None else op, batch)
            return
        try:
            rule = rule_for(op)
        except PropagationError:
            raise ServingError(
                f"{op.op_type} has no sharding rule, so which of its axes hold the positions "
                f"is unknown\n  in: {describe_op(op)}"
            ) from None
        factors = {rule.operands[i][lab.axis] for i, lab in derived}  # type: ignore[index]
        if None in factors or len(factors) > 1 or factors & set(rule.reduce):
            for v in op.outputs:
                self.label[v] = _Label(None, op)
            return
        (f,) = factors
        batch = {None if lab.batch is None else rule.operands[i][lab.batch] for i, lab in derived}
        fb = batch.pop() if len(batch) == 1 else None
        for i, (v, names) in enumerate(zip(op.inputs, rule.operands)):
            if v not in self.label and f in names:
                self.tables[(op, i)] = names.index(f)
            if v not in self.label and fb is not None and fb in names:
                self.batched.append(v)
        for v, names in zip(op.outputs, rule.results):
            axis = names.index(f) if f in names else None
            self.label[v] = _Label(
                axis, op, names.index(fb) if fb is not None and fb in names else None
            )

    def _attention(self, op: Op, derived: list[tuple[int, _Label]]) -> None:
        where = describe_op(op)
        mask = op.inputs[3] if len(op.inputs) > 3 else None
        if mask is not None:
            self._mask(op, mask)
        elif not op.attributes.get("causal"):
            raise ServingError(
                f"a KV-cached step needs causal attention (causal=True, or a mask over "
                f"positions that says which keys each query sees)\n  in: {where}"
            )
        if [i for i, _ in derived] != [0, 1, 2] or any(lab.axis != 2 for _, lab in derived):
            raise ServingError(
                "a KV-cached attention needs q, k and v computed from the tokens, positions "
                f"on axis 2\n  in: {where}"
            )
        if any(
            lab.batch != 0 and not (lab.batch is None and self.batch == 1) for _, lab in derived
        ):
            raise ServingError(
                f"a KV-cached attention needs its batch of sequences on axis 0\n  in: {where}"
            )
        self.attention.append(op)
        self.label[op.outputs[0]] = _Label(2, batch=0)
        self.sources[op] = (self._source(op.inputs[1]), self._source(op.inputs[2]))

    def _source(self, v: Value) -> tuple[Value, tuple[Op, ...]]:
        """What a layer caches for its attention's key (or value) operand ``v``: ``v``, or,
        when ``v`` repeats kv heads for grouped-query attention (views and a ``BroadcastTo``,
        as Hugging Face's ``repeat_kv`` before torch's attention), the value before the
        repetition and the ops that repeat it (replayed on the whole cache each step), so
        the cache keeps the model's kv heads."""
        chain: list[Op] = []
        at = v
        producers = self.f.producers
        while True:
            op = producers.get(at)
            if op in self.passthrough:
                at = op.inputs[self.passthrough[op]]
                continue
            if op is None or len(op.inputs) != 1 or at is not op.outputs[0]:
                break
            if not (get_op(op.op_type).extra.get("view") or op.op_type == "BroadcastTo"):
                break
            lab = self.label.get(op.inputs[0])
            if lab is None or lab.axis is None:
                break
            chain.insert(0, op)
            at = op.inputs[0]
        # cache the latest (batch, kv heads, positions, dim) value before the first broadcast
        first = next((i for i, op in enumerate(chain) if op.op_type == "BroadcastTo"), None)
        for j in range(first or 0, -1, -1):
            if first is None:
                break
            src = chain[j].inputs[0]
            t, lab = src.type, self.label[src]
            batch_ok = lab.batch == 0 or (lab.batch is None and self.batch == 1)
            if isinstance(t, TensorType) and t.rank == 4 and lab.axis == 2 and batch_ok:
                return src, tuple(chain[j:])
        return v, ()

    def _same(self, v: Value) -> Value:
        """``v``, or the value a pass-through op made it from."""
        op = self.f.producers.get(v)
        while op in self.passthrough:
            v = op.inputs[self.passthrough[op]]
            op = self.f.producers.get(v)
        return v

    def _appends_nothing(self, op: Op, derived: list[tuple[int, _Label]]) -> bool:
        """A ``Concat`` of a token-derived value with empty ones along its positions axis
        (an exported model's cache with no positions yet, ``torch.cat([past, k])``): the
        value itself, passed through."""
        if op.op_type != "Concat" or len(derived) != 1 or isinstance(op.inputs[0].type, TupleType):
            return False
        i, lab = derived[0]
        rank = op.inputs[i].type.rank  # type: ignore[union-attr]
        dim = op.attributes["dim"] % rank
        others = [v for j, v in enumerate(op.inputs) if j != i]
        if lab.axis != dim or any(v.type.shape[dim] for v in others):  # type: ignore[union-attr]
            return False
        self.passthrough[op] = i
        self.label[op.outputs[0]] = lab
        return True

    def _mask(self, op: Op, mask: Value) -> None:
        """A mask the step can slice: made from no token (a table over query and key positions,
        as a causal mask an importer folded), each of its last two axes one per position or
        broadcast."""
        t = mask.type
        where = describe_op(op)
        if mask in self.label:
            raise ServingError(
                f"the attention mask {mask.name!r} depends on the tokens (padding); a KV-cached "
                f"step serves equal-length sequences: drop the attention mask\n  in: {where}"
            )
        if (
            not isinstance(t, TensorType)
            or t.rank < 2
            or any(n not in (1, self.positions) for n in t.shape[-2:])
        ):
            raise ServingError(
                f"the attention mask {mask.name!r} {t} must have one row per query position and "
                f"one column per key position ({self.positions}, or 1 to broadcast)\n  in: {where}"
            )

    def check_rebatch(self) -> None:
        """Refuse another batch size where the batch axis is not followed through."""
        for v in self.batched:
            raise ServingError(
                f"{v.name!r} has the batch axis but depends on no token, so a step of "
                f"another batch size than {self.f.name}'s {self.batch} cannot be built; "
                "build the forward at the batch size you serve"
            )
        for op in self.needed:
            for v in op.inputs:
                lab = self.label.get(v)
                if lab is not None and lab.batch is None and lab.axis is not None:
                    raise ServingError(
                        f"{v.name!r} merges or mixes the batch of sequences (no batch axis is "
                        f"followed through it), so a step of another batch size than "
                        f"{self.batch} cannot be built; build the forward at the batch size "
                        f"you serve\n  in: {describe_op(op)}"
                    )

    def _layer(self, index: int, op: Op) -> CacheLayer:
        (k, _), (v, _) = self.sources[op]
        k, v = k.type, v.type
        assert isinstance(k, TensorType) and isinstance(v, TensorType)
        return CacheLayer(index, k.shape[1], k.shape[3], v.shape[3], k.dtype.itemsize_bytes)


def _reshaped(a: tuple[int, ...], b: tuple[int, ...], axis: int | None) -> int | None:
    """Where axis ``axis`` of shape ``a`` lands in shape ``b`` under a row-major reshape: the
    axis of ``b`` that it alone makes (axes of size 1 aside), or None when the reshape merges
    or splits it."""
    if axis is None:
        return None
    if a[axis] == 1:  # a batch of one: still the leading axis if both shapes lead with a 1
        return 0 if axis == 0 and b[:1] == (1,) else None
    ia = [i for i, n in enumerate(a) if n != 1]
    ib = [j for j, n in enumerate(b) if n != 1]
    i = j = 0
    while i < len(ia) and j < len(ib):
        gi, gj, pa, pb = [ia[i]], [ib[j]], a[ia[i]], b[ib[j]]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb and i < len(ia):
                pa *= a[ia[i]]
                gi.append(ia[i])
                i += 1
            elif pb < pa and j < len(ib):
                pb *= b[ib[j]]
                gj.append(ib[j])
                j += 1
            else:
                return None
        if axis in gi:
            return gj[0] if len(gi) == len(gj) == 1 else None
    return None


def _mixing(op: Op) -> str:
    """Why ``op`` loses the positions axis, in words."""
    if get_op(op.op_type).extra.get("view"):
        return (
            f"a {op.op_type} merges it with another axis (a (batch x positions, features) view, "
            "as torch's Linear on 3-D inputs exports it): import the model with batch 1, or "
            "keep the axes apart"
        )
    return (
        "an op mixes every position of the sequence (only a causal fused Attention, or one "
        "with a mask over positions, may: build the model with attention='fused')"
    )


def _token_input(f: Function, name: str | None) -> Value:
    if name is not None:
        found = [v for v in f.inputs if v.name == name]
        if not found:
            raise ServingError(f"{f.name} has no input {name!r}; its inputs: {_names(f)}")
        v = found[0]
    else:
        readers = {v for op in f.ops if op.op_type == "Embedding" for v in op.inputs[1:2]}
        ids = [v for v in f.inputs if v in readers]
        if len(ids) != 1:
            raise ServingError(
                f"cannot tell the token ids of {f.name} (inputs read as Embedding ids: "
                f"{[v.name for v in ids]}); name them: tokens='...'"
            )
        v = ids[0]
    t = v.type
    if not isinstance(t, TensorType) or t.rank != 2 or t.dtype.is_float:
        raise ServingError(
            f"token ids {v.name!r} must be integers of shape (batch, positions), got {t}"
        )
    return v


def _names(f: Function) -> list[str]:
    return [v.name for v in f.inputs]


def _needed_ops(f: Function, outputs: list[Value]) -> list[Op]:
    wanted = set(outputs)
    needed: list[Op] = []
    for op in reversed(f.ops):
        if any(v in wanted for v in op.outputs):
            needed.append(op)
            wanted.update(op.inputs)
    return needed[::-1]


class _Step:
    """Builds the step over positions ``[past, past + n)`` (see the module docstring)."""

    def __init__(self, a: _Analysis, past: int, n: int, logits: str, name: str, batch: int) -> None:
        self.a, self.past, self.n, self.batch = a, past, n, batch
        f = a.f
        if batch != a.batch:
            a.check_rebatch()
        self.b = b = FunctionBuilder(name)
        needed_inputs = {v for op in a.needed for v in op.inputs}
        self.env: dict[Value, Value] = {}
        self.window: dict[Value, tuple[int, int]] = {}
        for v in f.inputs:
            if v is a.tokens:
                t = v.type.with_shape((batch, n))  # type: ignore[union-attr]
                self.env[v] = b.input(v.name, t)
                self.window[v] = (past, past + n)
            elif v in needed_inputs and v not in a.label:
                self.env[v] = b.input(v.name, v.type)
        # every step reads each layer's cache and returns it grown (a prefill's has no
        # positions yet: it writes the prompt's keys and values into the engine's cache)
        self.past_kv: list[tuple[Value, Value]] = []
        for op, layer in zip(a.attention, a.layers):
            shape = (batch, layer.kv_heads, past)
            (k, _), (v, _) = a.sources[op]
            k, v = k.type, v.type
            assert isinstance(k, TensorType) and isinstance(v, TensorType)
            pk = b.input(f"past_key_{layer.layer}", k.with_shape((*shape, layer.key_dim)))
            pv = b.input(f"past_value_{layer.layer}", v.with_shape((*shape, layer.value_dim)))
            self.past_kv.append((pk, pv))
        last_attention = max(f.ops.index(op) for op in a.attention)
        self.late = set(f.ops[last_attention + 1 :]) if logits == "last" else set()
        self.present: list[Value] = []  # key, value of each layer
        self._cuts: dict[tuple, Value] = {}  # each operand cut to a window once
        # the ops repeating kv heads run on the whole cache, in _attention, not on the window
        replayed = {c for pair in a.sources.values() for _, chain in pair for c in chain}
        readers: dict[Value, set[Op]] = {}
        for op in a.needed:
            for v in op.inputs:
                readers.setdefault(v, set()).add(op)
        self.replayed = {
            c for c in replayed if readers.get(c.outputs[0], set()) <= replayed | set(a.attention)
        }

    def build(self) -> Function:
        for op in self.a.needed:
            if op in self.a.passthrough:
                v = op.inputs[self.a.passthrough[op]]
                self.env[op.outputs[0]], self.window[op.outputs[0]] = self.env[v], self.window[v]
            elif op in self.replayed:
                continue
            elif op.op_type == "Attention" and op in self.a.attention:
                self._attention(op)
            elif any(v in self.a.label for v in op.inputs):
                self._windowed(op)
            else:  # depends on weights and constants only
                outs = self.b.add_op_like(op, [self.env[v] for v in op.inputs], self._names(op))
                self.env.update(zip(op.outputs, outs.outputs))
        logits = [self.env[v] for v in self.a.outputs]
        return self.b.finish([*logits, *self.present])

    def _names(self, op: Op) -> list[str]:
        return [v.name for v in op.outputs]

    def _target(self, op: Op) -> tuple[int, int]:
        end = self.past + self.n
        return (end - 1, end) if op in self.late else (self.past, end)

    def _operand(self, op: Op, i: int, target: tuple[int, int]) -> Value:
        """Operand ``i`` of ``op`` cut to the ``target`` positions."""
        v = op.inputs[i]
        x = self.env[v]
        lab = self.a.label.get(v)
        if lab is not None:
            lo, hi = self.window[v]
            if (lo, hi) == target:
                return x
            axis, start = lab.axis, target[0] - lo
        elif (op, i) in self.a.tables:  # a positions table: its rows are the positions
            axis, start = self.a.tables[(op, i)], target[0]
        else:
            return x
        key = (x, axis, start, target[1] - target[0])
        cut = self._cuts.get(key)
        if cut is None:
            end = start + target[1] - target[0]
            cut = self.b.call("Slice", x, axis=axis, start=start, end=end, name=f"{v.name}_at")
            self._cuts[key] = cut
        return cut

    def _windowed(self, op: Op) -> None:
        target = self._target(op)
        ins = [self._operand(op, i, target) for i in range(len(op.inputs))]
        attrs = dict(op.attributes)
        opdef = get_op(op.op_type)
        position = opdef.extra.get("position_attribute")
        if position is not None:
            attrs[position] = int(attrs.get(position, 0)) + target[0]
        else:
            rule = rule_for(op)
            if rule.local_attributes is not None:
                outs = [self._local_type(v, target) for v in op.outputs]
                attrs = dict(rule.local_attributes(attrs, [x.type for x in ins], outs))
        new = self.b.add_op(
            op.op_type,
            ins,
            attrs,
            names=self._names(op),
            subfunctions=op.subfunctions,
            op_name=op.name,
        )
        for v, x in zip(op.outputs, new.outputs):
            self.env[v] = x
            self.window[v] = target

    def _operand_value(self, v: Value, target: tuple[int, int]) -> Value:
        """Token-derived ``v`` (already built) cut to the ``target`` positions."""
        x = self.env[v]
        lo, hi = self.window[v]
        if (lo, hi) == target:
            return x
        axis = self.a.label[v].axis
        start = target[0] - lo
        end = start + target[1] - target[0]
        return self.b.call("Slice", x, axis=axis, start=start, end=end, name=f"{v.name}_at")

    def _replay(self, op: Op, x: Value, target: tuple[int, int]) -> Value:
        """``op`` (a view or broadcast of one operand) on ``x``, positions ``target``."""
        attrs = dict(op.attributes)
        rule = rule_for(op)
        if rule.local_attributes is not None:
            outs = [self._local_type(v, target) for v in op.outputs]
            attrs = dict(rule.local_attributes(attrs, [x.type], outs))
        return self.b.add_op(op.op_type, [x], attrs, names=self._names(op)).outputs[0]

    def _mask_rows(self, mask: Value, target: tuple[int, int]) -> Value:
        """The mask's rows of the window's queries and its columns of every key so far."""
        x = self.env[mask]
        rank = mask.type.rank  # type: ignore[union-attr]
        for axis, (lo, hi) in ((rank - 2, target), (rank - 1, (0, target[1]))):
            if x.type.shape[axis] != 1 and (lo, hi) != (0, x.type.shape[axis]):  # type: ignore[union-attr]
                x = self.b.call("Slice", x, axis=axis, start=lo, end=hi, name=f"{mask.name}_at")
        return x

    def _local_type(self, v: Value, target: tuple[int, int]) -> TensorType:
        t = v.type
        lab = self.a.label[v]
        assert isinstance(t, TensorType)
        shape = list(t.shape)
        if lab.axis is not None:
            shape[lab.axis] = target[1] - target[0]
        if lab.batch is not None:
            shape[lab.batch] = self.batch
        return t.with_shape(tuple(shape))

    def _attention(self, op: Op) -> None:
        target = self._target(op)
        q = self._operand(op, 0, target)
        mask = [self._mask_rows(op.inputs[3], target)] if len(op.inputs) > 3 else []
        layer = self.a.attention.index(op)
        full = []
        for i, past, (src, chain), which in zip(
            (1, 2), self.past_kv[layer], self.a.sources[op], ("key", "value")
        ):
            # the value before the kv heads are repeated, if they are: the cache holds that
            x = self._operand_value(src, target) if chain else self._operand(op, i, target)
            present = self.b.call("CacheAppend", past, x, axis=2, name=f"present_{which}_{layer}")
            self.present.append(present)
            for c in chain:  # the repetition, on every position so far
                present = self._replay(c, present, (0, target[1]))
            full.append(present)
        new = self.b.add_op_like(op, [q, *full, *mask], [x.name for x in op.outputs])
        self.env[op.outputs[0]] = new.outputs[0]
        self.window[op.outputs[0]] = target


def _count(what: str, n: object, low: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < low:
        raise ServingError(f"{what} must be an integer >= {low}, got {n!r}")
    return n


def _check_positions(a: _Analysis, past: int, n: int, what: str) -> None:
    end = past + n
    if end > a.positions:
        raise ServingError(
            f"{what} reaches position {end}, beyond the model's {a.positions} positions by "
            f"{end - a.positions} (the forward {a.f.name!r} takes sequences of up to "
            f"{a.positions} tokens: its tokens input is {a.tokens.type})"
        )


def analyse(forward: Function, *, tokens: str | None = None) -> _Analysis:
    """The analysis of ``forward`` that the steps are built from (its token ids, positions,
    attention layers); raises a :class:`ServingError` where it cannot be served."""
    if not isinstance(forward, Function):
        raise ServingError(f"expected a forward Function, got {type(forward).__name__}")
    return _Analysis(forward, tokens)


def cache_layers(forward: Function, *, tokens: str | None = None) -> list[CacheLayer]:
    """Each attention layer's cache geometry (kv heads, key and value channels, bytes)."""
    return analyse(forward, tokens=tokens).layers


def step(
    forward: Function,
    past: int,
    new: int,
    *,
    logits: str = "last",
    tokens: str | None = None,
    name: str | None = None,
    batch: int | None = None,
) -> Function:
    """The step that computes positions ``[past, past + new)`` of a batch of sequences with
    ``past`` positions cached (prefill: ``past=0``; decode: ``new=1``; a chunked prefill in
    between). See the module docstring. ``batch``: the number of sequences (None:
    ``forward``'s batch; another one follows the batch axis through every op)."""
    if logits not in LOGITS:
        raise ServingError(f"logits must be one of {LOGITS}, got {logits!r}")
    past, new = _count("the cached context", past, 0), _count("the new tokens", new, 1)
    a = analyse(forward, tokens=tokens)
    batch = a.batch if batch is None else _count("batch", batch, 1)
    _check_positions(a, past, new, f"{past} cached + {new} new token(s)")
    default = f"{forward.name}_prefill" if not past else f"{forward.name}_decode"
    return _Step(a, past, new, logits, name or default, batch).build()


def prefill_step(
    forward: Function,
    prompt_len: int,
    *,
    logits: str = "last",
    tokens: str | None = None,
    batch: int | None = None,
) -> Function:
    """The prefill of a batch of prompts of ``prompt_len`` tokens: inputs the weights,
    ``tokens (B, prompt_len)`` and each layer's empty cache ``past_key_<l>``,
    ``past_value_<l>`` ``(B, kv_heads, 0, head_dim)``; outputs the logits of the last
    position ``(B, 1, V)`` (``logits="all"``: of every position) and each layer's
    ``present_key_<l>``, ``present_value_<l>`` ``(B, kv_heads, prompt_len, head_dim)``: the
    KV cache, written. ``batch``: the number of prompts (None: ``forward``'s batch).

    >>> import ir
    >>> f = ir.models.llama(2, 32, 64, 8, 100, 2, kv_heads=2, ffn=96)
    >>> p = prefill_step(f, 12)
    >>> [(v.name, v.type.shape) for v in p.outputs[:3]]
    [('logits', (2, 1, 100)), ('present_key_0', (2, 2, 12, 8)), ('present_value_0', (2, 2, 12, 8))]
    """
    n = _count("prompt_len", prompt_len, 1)
    return step(forward, 0, n, logits=logits, tokens=tokens, batch=batch)


def decode_step(
    forward: Function, context_len: int, *, tokens: str | None = None, batch: int | None = None
) -> Function:
    """One decode step of a batch of sequences with ``context_len`` positions cached: inputs
    the weights, ``tokens (B, 1)`` and each layer's ``past_key_<l>``, ``past_value_<l>``
    ``(B, kv_heads, context_len, head_dim)``; outputs the next-token logits ``(B, 1, V)``
    and the caches with the new position appended (``present_key_<l>``, ...,
    ``context_len + 1`` positions), the next step's inputs. ``batch``: the number of
    sequences (None: ``forward``'s batch).

    >>> import ir
    >>> d = decode_step(ir.models.gpt(2, 32, 64, 8, 100, 2, kv_heads=4), 20)
    >>> [(v.name, v.type.shape) for v in d.inputs[-2:]]
    [('past_key_1', (2, 4, 20, 8)), ('past_value_1', (2, 4, 20, 8))]
    """
    n = _count("context_len", context_len, 1)
    return step(forward, n, 1, tokens=tokens, batch=batch)
