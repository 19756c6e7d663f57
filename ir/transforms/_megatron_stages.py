"""The per-stage emission of :func:`ir.transforms.megatron`: the steady-state inputs and
every (stage, microbatch, phase) task in schedule order.

Each task's run of local ops is one ``Pmap`` over the stage's devices (its body written
once, shared by every microbatch that runs it), tensor-parallel conversions are grouped
collectives, activations move between stages with ``SendEach``, and each weight
gradient is summed over microbatches and reduced among its replicas as soon as its
last microbatch's backward has made it. A repeated step of a later microbatch is added
like the first (``FunctionBuilder.add_like``).
"""

from __future__ import annotations

import itertools
from collections import ChainMap
from collections.abc import Mapping, Sequence
from typing import Any

from ..builder import FunctionBuilder
from ..function import Function
from ..op import Op
from ..types import Devices, DeviceVar, TensorType, TupleType, bound_tuple
from ..value import Value
from ._megatron_piece import copy_op
from ._megatron_plan import VAR, Item, MegatronPlan, level
from ._rewrite import TransformError
from ._spmd import P, R, Shard
from .pipeline import exchange_values


class StageEmission(MegatronPlan):
    """Adds the inputs and the stages' tasks of the step to ``self.b``."""

    # the gradient reductions left for after the tasks (None: each made when ready)
    _deferred: list[tuple[Value, int]] | None = None
    # T.megatron(tasks=True): each task of a microbatch between the first and the last
    # one Task op, its body written once per (stage, phase) (_emit_as_task)
    as_tasks: bool = False

    # -- emission --------------------------------------------------------------------------

    def _emit_inputs(self) -> None:
        """Start the builder and add the steady-state inputs: weights replicated over dp and
        laid out over tp on their stage; batch inputs split into microbatches and replicas
        on their stage."""
        t, hplan, dplan = self.t, self.hplan, self.dplan
        b = self.b = FunctionBuilder(t.name)
        # Each microbatch's values: key -> its value on the stage that made it (``at``),
        # and that stage (``home``); copies sent to other stages by (key, mb, stage);
        # weights once for every microbatch. Flat dicts per microbatch, not a tuple key
        # per value: a step of hundreds of microbatches puts millions.
        self.at: list[dict[Value, Value]] = [{} for _ in range(self.m)]
        self.home: list[dict[Value, int]] = [{} for _ in range(self.m)]
        self.sent: dict[tuple[Value, int, int], Value] = {}
        self._sent_as: dict[Value, tuple[Value, int]] = {}  # a sent copy -> (key, stage)
        self._tasks: dict[tuple, Any] = {}  # each kind of task: _TaskForm, or None (flat)
        self._shaped: dict[tuple, Function] = {}  # tasks=True: a body per shape (_shape_of)
        self._op_shapes: dict[Op, tuple] = {}  # each local op's part of a shape
        self._reading: dict[Value, set[tuple[int, str]]] | None = None  # _reading_tasks
        self.weights: dict[Value, Value] = {}
        self.weights_on: dict[tuple[Value, int], Value] = {}  # a buffer sent to a stage
        self._bodies: dict[Value, Function] = {}  # gradient sums' bodies, by gradient
        self._runs: dict[tuple, tuple] = {}  # each run of items (and sums): _body's answer
        self._steps: dict[tuple, list] = {}  # each kind of task: its steps (_task_steps)
        self._first: dict[tuple, Op] = {}  # each repeated step's first op, by step
        self._flat: dict[tuple[TensorType, int], TupleType] = {}  # see flat_type
        self._on: dict[int, Devices] = {}  # each pipeline rank's devices (flat_type)
        self.acc: dict[Value, Value] = {}
        self.layouts: dict[str, tuple[str, ...]] = {}
        self.stage_of_key: dict[Value, int] = {}
        for item in self.items:
            for k in item.keys:
                self.stage_of_key.setdefault(k, item.stage)
        self.inputs: dict[Value, Value] = {}
        self.weight_input: dict[Value, Value] = {}
        self.batch_split: dict[Value, Value] = {}
        piece_inputs = self.piece_inputs()
        self._items_reading: dict[Value, list[Item]] = {}
        for item in self.items:
            for k in item.keys:
                self._items_reading.setdefault(k, []).append(item)
        post_users_of: dict[Value, list[Op]] = {}
        updating: dict[Value, list[Op]] = {}  # weight -> the optimizer steps that update it
        for op in self.post:
            for k in dict.fromkeys(self.post_keys[op]):
                post_users_of.setdefault(k, []).append(op)
            updating.setdefault(self.post_keys[op][0], []).append(op)
        post_states = self._post_states(piece_inputs)
        for v in t.inputs:
            p = piece_inputs.get(v)
            post_users = post_users_of.get(v, [])
            if p is None and not post_users:  # (an input returned: copied, _analyse)
                continue
            if dplan.state[v] == R:
                stage = self._weight_stage(v, p, post_users, bool(updating.get(v)))
                for op in updating.get(v, ()):
                    self.stage_of_post[op] = stage
                state = hplan.state.get(p, R) if p is not None else post_states.get(v, R)
                w = v if p is not None else self.state_of.get(v, v)  # its weight
                if w is v and p is None:
                    local = self._local_type(v.type, state, stage)
                else:  # as its weight is split (tensor ranks, expert group)
                    local = TensorType(self.weight_local(w).shape, v.type.dtype)
                dp_level = "R"
                zd = self._zero_axis(self.state_of.get(v)) if p is None else None
                if self.zero == 3 and p is not None:  # ZeRO-3: the replicas split the weight
                    zd = self._zero_axis(v)
                group = self.weight_group.get(w, "dp")
                if zd is not None:  # ZeRO: the replicas split the optimizer state
                    shape = list(local.shape)
                    shape[zd] //= self.group_size(group)
                    local = local.with_shape(tuple(shape))
                    dp_level = f"S({zd})"
                x = b.input(v.name, self.flat_type(local, stage))
                ep_state = "S(0)" if self.is_expert(w) else "R"
                self.layouts[v.name] = self.weight_layout(
                    dp_level, level(state, self.tp), group, ep_state
                )
                self.weight_input[v] = x
                if p is not None:
                    # read by its stage's tasks (ZeRO-3: its part); a buffer read by
                    # several stages (_weight_stage) is sent to the others once
                    self.weights[getattr(self, "zero3_shard", {}).get(p, p)] = x
                    self._send_once(p, x, stage)
            else:
                stage = self.stage_of_key[p]
                state = hplan.state[p] if p is not None else R
                local = hplan.local.value(p).type.with_device(None)
                per_mb = self.flat_type(local, stage)
                x = b.input(v.name, TupleType((per_mb,) * self.m))
                self.layouts[v.name] = self.batch_layout(level(state, self.tp))
                for mb in range(self.m):
                    split = b.call("TupleGet", x, index=mb, name=f"{v.name}_mb{mb}")
                    self._put(p, mb, stage, split)

    def _weight_stage(
        self, v: Value, p: Value | None, post_users: list[Op], updated: bool = True
    ) -> int:
        """The stage whose ops read weight ``v``; its optimizer steps run there too. An
        input no optimizer updates (a buffer) may be read by several: the first."""
        stages = set()
        if p is not None:
            stages |= {item.stage for item in self._items_reading.get(p, ())}
        if not stages:
            stages |= {self.stage_of_post[op] for op in post_users}
        if len(stages) > 1 and not updated:
            return min(stages)
        if len(stages) > 1:
            raise TransformError(
                f"pipeline level: weight {v.name!r} is read by stages {sorted(stages)}; a "
                "weight shared between stages (tied embeddings) is not supported"
            )
        return stages.pop() if stages else 0

    def _send_once(self, p: Value, x: Value, home: int) -> None:
        """An input read on stages other than ``home`` (a buffer, ``_weight_stage``): sent
        to each once, at the start of the step, for every microbatch there."""
        for s in sorted({item.stage for item in self._items_reading.get(p, ())} - {home}):
            names = [f"{p.name}_s{s}"]
            (moved,) = self._add(
                ("send", p, home, s), "SendEach", [x], {"to_devices": self.devices(s)}, names
            )
            self.weights_on[(p, s)] = moved

    def _post_states(self, piece_inputs: Mapping[Value, Value]) -> dict[Value, Shard]:
        """The tensor-parallel state of each optimizer operand: that of the weight of the
        first optimizer step reading it whose weight the piece reads (an optimizer-only
        input, Adam's moments say, is laid out as its weight)."""
        states: dict[Value, Shard] = {}
        for op in self.post:
            p = piece_inputs.get(self.post_keys[op][0])
            if p is not None:
                for k in self.post_keys[op]:
                    states.setdefault(k, self.hplan.state.get(p) or R)
        return states

    def _put(self, key: Value, mb: int, stage: int, value: Value) -> None:
        """``value`` is ``key`` of microbatch ``mb``, made on ``stage`` (made again there:
        it replaces the first, as a value regathered for the backward pass does)."""
        self.at[mb][key] = value
        self.home[mb].setdefault(key, stage)

    def value(self, key: Value, mb: int, stage: int) -> Value:
        """``key`` of microbatch ``mb`` on ``stage``'s devices (sent there once)."""
        found = self.at[mb].get(key)
        if found is None:
            found = self.weights_on.get((key, stage)) or self.weights.get(key)
            if found is None:
                raise TransformError(f"internal: {key.name} of microbatch {mb} is used before made")
            return found
        home = self.home[mb][key]
        if home == stage:
            return found
        moved = self.sent.get((key, mb, stage))
        if moved is None:
            attributes = {"to_devices": self.devices(stage)}
            names = [f"{key.name}_mb{mb}_s{stage}"]
            step = ("send", key, home, stage)
            (moved,) = self._add(step, "SendEach", [found], attributes, names)
            self.sent[(key, mb, stage)] = moved
            self._sent_as[moved] = (key, stage)
        return moved

    def _merge(self) -> None:
        self._readers = self._items_reading  # the items that read each key
        self._kept = set(self.final.values()) | self.summed
        self._piece_of_final = {h: p for p, h in self.final.items()}
        producer: dict[Value, tuple[int, str]] = {}
        for key, items in self.tasks.items():
            for item in items:
                if item.regather:
                    continue
                for v in item.outputs:
                    producer[v] = key
        # per task kind: what it reads from another pipeline rank, received at the
        # exchange before the task (run_exchanges)
        reads = {key: [(it.keys, it.outputs) for it in items] for key, items in self.tasks.items()}
        groups, pp = self.exchange_groups, self.pp  # stage s runs on pipeline rank s % pp
        exchange_values(groups, reads, producer, lambda s: s % pp, self._emit_task, self._send)

    def _send(self, k: Value, s: int, mb: int) -> None:
        """Send ``k`` (of microbatch ``mb``) to stage ``s`` (exchange_values)."""
        self.value(k, mb, s)

    def _emit_task(self, s: int, mb: int, phase: str) -> None:
        # A task's steps are the same for every microbatch but the first (no sums yet)
        # and the last (bodies end where a gradient is complete): found once per kind.
        kind = (s, phase, mb == 0, mb == self.m - 1)
        steps = self._steps.get(kind)
        if steps is None:
            steps = self._steps[kind] = self._task_steps(s, mb, phase)
        if self.as_tasks and 0 < mb < self.m - 1 and self._emit_as_task(kind, steps, s, mb):
            return
        self._emit_steps(steps, s, mb)

    def _emit_steps(self, steps: list, s: int, mb: int) -> None:
        for step in steps:
            if step.__class__ is Item:
                self._emit_conversion(step, s, mb)
            else:
                self._emit_run(step, s, mb)

    def _emit_as_task(self, kind: tuple, steps: list, s: int, mb: int) -> bool:
        """Microbatch ``mb``'s task of ``kind`` as one Task op (False: emit it flat). The
        first of a kind is written into a body (:meth:`_task_form`); every later one is
        that op again on this microbatch's values (typed once: ``add_like``)."""
        form = self._tasks.get(kind, _UNSEEN)
        if form is _UNSEEN:
            form = self._tasks[kind] = self._task_form(steps, s, mb, kind[1])
            return form is not None
        if form is None:
            return False
        at, acc, sent = self.at[mb], self.acc, self.sent
        operands = []
        try:
            for role, x in form.ins:
                if role is _AT:
                    operands.append(at[x])
                elif role is _SENT:
                    operands.append(sent[(x[0], mb, x[1])])
                elif role is _ACC:
                    operands.append(acc[x])
                else:
                    operands.append(x)
        except KeyError as e:
            raise TransformError(
                f"internal: microbatch {mb}'s task on stage {s} lacks {e} that its kind reads"
            ) from None
        results = self.b.add_like(form.op, operands, _named(form.names, mb)).outputs
        self._task_made(mb, form.outs, results, form.homes)
        return True

    def _task_made(self, mb: int, outs: list, results: Sequence[Value], homes: Any) -> None:
        """A task's results where the step keeps them, by role (_task_form)."""
        at, acc, sent = self.at[mb], self.acc, self.sent
        for (role, x), out in zip(outs, results):
            if role is _AT:
                at[x] = out
            elif role is _ACC:
                acc[x] = out
            else:
                sent[(x[0], mb, x[1])] = out
                self._sent_as[out] = x
        home = self.home[mb]
        for k, st in homes:
            home.setdefault(k, st)

    def _task_form(self, steps: list, s: int, mb: int, phase: str) -> _TaskForm | None:
        """Emit microbatch ``mb``'s task as a Task op whose body holds its steps, and what
        the task reads and makes by role (a key of the microbatch, a copy sent to a stage,
        a gradient's sum so far, or a value every microbatch reads alike), so that the
        next microbatches' tasks are the same op on their values. None (nothing emitted)
        where the task cannot be one (it makes nothing, or stores a value it did not make)
        or is one op (nothing to share)."""
        main, at, home, acc, sent = self.b, self.at[mb], self.home[mb], self.acc, self.sent
        body_b = _Capturing(f"{self.t.name}_s{s}_{'forward' if phase == 'F' else 'backward'}")
        # the steps write into fresh maps over the step's: what they add is what the
        # task makes (and nothing the step had is touched if it cannot be a task)
        self.b = body_b
        self.at[mb], self.home[mb] = ChainMap({}, at), ChainMap({}, home)
        self.acc, self.sent = ChainMap({}, acc), ChainMap({}, sent)
        try:
            self._emit_steps(steps, s, mb)
            new_at, new_home = self.at[mb].maps[0], self.home[mb].maps[0]
            new_acc, new_sent = self.acc.maps[0], self.sent.maps[0]
        finally:
            self.b, self.at[mb], self.home[mb], self.acc, self.sent = main, at, home, acc, sent
        outs: list[tuple[Any, Any]] = []
        values: list[Value] = []
        names: list[tuple[str, str]] = []
        reading = self._reading_tasks()
        kept, here = self._kept, (s, phase)
        for k, v in new_at.items():
            if k not in kept and reading.get(k, set()) <= {here}:
                continue  # read by this task alone: the body's own
            outs.append((_AT, k))
            values.append(v)
            names.append((f"{k.name}_mb", ""))
        for k, v in new_acc.items():
            outs.append((_ACC, k))
            values.append(v)
            names.append((f"{k.name}_acc", ""))
        for (k, m_, st), v in new_sent.items():
            if m_ != mb:
                return None
            outs.append((_SENT, (k, st)))
            values.append(v)
            names.append((f"{k.name}_mb", f"_s{st}"))
        if not values or not all(map(body_b.defines, values)) or len(body_b.ops) < 2:
            return None  # (a task of one op is that op)
        by_value = {v: k for k, v in at.items()}
        summed = {v: k for k, v in acc.items()}
        ins: list[tuple[Any, Any]] = []
        for x in body_b.captured:
            if x in by_value:
                ins.append((_AT, by_value[x]))
            elif x in summed:
                ins.append((_ACC, summed[x]))
            elif x in self._sent_as:
                ins.append((_SENT, self._sent_as[x]))
            else:  # the weights, a buffer sent once, a stage's anchor: every microbatch's
                ins.append((_FIXED, x))
        body = body_b.finish(values)
        named = _named(names, mb)
        op = main.add_op("Task", list(body_b.captured), {}, names=named, subfunctions=[body])
        homes = tuple(new_home.items())
        self._task_made(mb, outs, op.outputs, homes)
        return _TaskForm(op, ins, outs, names, homes)

    def _reading_tasks(self) -> dict[Value, set[tuple[int, str]]]:
        """Each key -> the tasks (stage, phase) whose items read it (regathers too)."""
        found = self._reading
        if found is None:
            found = self._reading = {}
            for key, items in self.tasks.items():
                for item in items:
                    for k in item.keys:
                        found.setdefault(k, set()).add(key)
        return found

    def _task_steps(self, s: int, mb: int, phase: str) -> list[Item | _Run]:
        """Task ``(s, phase)``'s conversions and runs of local ops, as microbatch ``mb``
        (and every microbatch of its kind) emits them."""
        steps: list[Item | _Run] = []
        run: list[Item] = []
        for item in self.tasks[(s, phase)]:
            if item.op is None:
                steps += self._run_step(run, s)
                run = []
                steps.append(item)
                continue
            run.append(item)
            # End the body where a gradient is complete, so that its all-reduce can start
            # while the rest of the backward pass runs.
            if mb == self.m - 1 and any(v in self.summed for v in item.outputs):
                steps += self._run_step(run, s)
                run = []
        steps += self._run_step(run, s)
        return steps

    def _run_step(self, run: list[Item], s: int) -> list[_Run]:
        """The Pmap step of ``run`` (none if nothing it makes is used later)."""
        if not run:
            return []
        # a gradient summed over microbatches is added to the sum so far at the end of
        # the body that makes it (one Pmap, not one more per gradient and microbatch)
        inside = set(run)
        summing = tuple(
            v
            for item in run
            for v in item.outputs
            if v in self.acc
            and not self._scattered(v)
            and all(r in inside for r in self._readers.get(v, ()))
        )
        key = (tuple(run), summing)
        found = self._runs.get(key)
        if found is None:
            found = self._runs[key] = self._body(run, s, summing)
        inputs, results, body = found
        if not results:
            return []
        return [_Run(inputs, results, body, summing, s % self.pp)]

    def _emit_run(self, step: _Run, s: int, mb: int) -> None:
        # what value() answers, looked up here for the common case (made on this stage)
        at, home, value = self.at[mb], self.home[mb], self.value
        operands = []
        for k in step.inputs:
            found = at.get(k)
            operands.append(found if found is not None and home[k] == s else value(k, mb, s))
        if not operands:
            operands.append(self._anchor(s))
        acc = self.acc
        operands += [acc[v] for v in step.summing]
        names = [prefix + str(mb) for prefix in step.prefixes]
        outs = self._add(step.key, "Pmap", operands, _PMAP_ATTRIBUTES, names, step.body)
        for v, out, summed in zip(step.results, outs, step.summed):
            if summed:
                acc[v] = out
                if mb == self.m - 1:
                    self._reduce_gradient(v, s)
            else:
                self._made(v, mb, s, out)

    def _add(
        self,
        step: tuple,
        op_type: str,
        inputs: list[Value],
        attributes: dict[str, Any],
        names: list[str],
        body: Function | None = None,
    ) -> tuple[Value, ...]:
        """Append an op; ``step`` names what it does (its body, conversion, gradient or
        transfer, which fix its attributes), and the same step of a later microbatch, on
        operands of the same types, is added like the first (typed once:
        ``FunctionBuilder.add_like``)."""
        first = self._first.get(step)
        if first is not None:
            return self.b.add_like(first, inputs, names).outputs
        bodies = [body] if body is not None else []
        op = self.b.add_op(op_type, inputs, attributes, names=names, subfunctions=bodies)
        self._first[step] = op
        return op.outputs

    def _body(
        self, run: list[Item], s: int, summing: tuple[Value, ...] = ()
    ) -> tuple[list[Value], list[Value], Function | None]:
        """The keys ``run`` reads, those it makes that are used later, and its pmap body
        (None if nothing it makes is used): found once, shared by every microbatch that
        runs it (a stage's microbatches run the same ops on the same shapes). For each
        value of ``summing`` the body also takes the sum so far (after the keys) and
        returns the new sum in the value's place."""
        made = {v for item in run for v in item.outputs}
        inputs: list[Value] = []
        for item in run:
            for k in item.keys:
                if k not in made and k not in inputs:
                    inputs.append(k)
        later = self._used_later(run)
        results = [v for item in run for v in item.outputs if v in later]
        if not results:
            return inputs, results, None
        shape = self._shape_of(run, inputs, results, summing) if self.as_tasks else None
        if shape is not None:
            found = self._shaped.get(shape)
            if found is not None:
                return inputs, results, found
        body = self._new_body(run, s, summing, inputs, results)
        if shape is not None:
            self._shaped[shape] = body
        return inputs, results, body

    def _shape_of(
        self, run: list[Item], inputs: list[Value], results: list[Value], summing: tuple
    ) -> tuple | None:
        """What fixes ``run``'s body up to its names: the operand types, each op's type,
        attributes and operand types and where its operands come from (an input, an
        earlier op's result), and which results the body returns and sums. Runs of one
        shape (every layer of a model of equal layers, on any stage) share one body
        (``tasks=True``); None where an op has a body, or the run no input."""
        if not inputs:  # its anchor is whatever the stage holds (_anchor)
            return None
        local = self.hplan.local
        where: dict[Value, tuple[int, int]] = {k: (-1, i) for i, k in enumerate(inputs)}
        # (the phase too: a forward run and a backward one are not one body, so a body's
        # ops keep one role for the viewers, ir.search's rows aside)
        shape: list[Any] = [run[0].phase, tuple(local.value(k).type for k in inputs)]
        ops = self._op_shapes
        for n, item in enumerate(run):
            op = item.op
            own = ops.get(op)
            if own is None:
                if op.subfunctions:
                    return None
                own = ops[op] = (  # (attributes by text: 1 and 1.0 are not one)
                    op.op_type,
                    tuple((k, repr(x)) for k, x in op.attributes.items()),
                    tuple(v.type for v in op.inputs),
                )
            shape.append((own, tuple(where[k] for k in item.keys)))
            for j, v in enumerate(item.outputs):
                where[v] = (n, j)
        shape.append(tuple(where[v] for v in results))
        shape.append(tuple(where[v] for v in summing))
        return tuple(shape)

    def _new_body(
        self,
        run: list[Item],
        s: int,
        summing: tuple[Value, ...],
        inputs: list[Value],
        results: list[Value],
    ) -> Function:
        body_b = FunctionBuilder(f"{self.t.name}_s{s}")
        env: dict[Value, Value] = {}
        for k in inputs:
            env[k] = body_b.input(k.name, self.hplan.local.value(k).type)
        if not inputs:  # ops of no operand (the ids a vocabulary split slices): see _anchor
            anchor = self._anchor(s).type.elements[0]
            body_b.input("anchor", anchor.with_device(DeviceVar(VAR)))
        sums = {v: body_b.input(f"{v.name}_acc", self.hplan.local.value(v).type) for v in summing}
        for item in run:
            outs = copy_op(body_b, item.op, [env[k] for k in item.keys])
            for v, y in zip(item.outputs, outs):
                env[v] = y
        for v in summing:  # after the body's ops, as the separate sums ran before
            env[v] = body_b.call("Add", sums[v], env[v], name=f"{v.name}_sum")
        return body_b.finish([env[v] for v in results])

    def _anchor(self, s: int) -> Value:
        """A per-device tuple on ``s``'s devices that a pmap of ops with no operand (an
        ``Arange`` whose ids the tensor ranks slice) maps over, unread: a pmap takes its
        devices from its operands."""
        devices = tuple(self.devices(s))
        values = (x for per_mb in self.at for x in per_mb.values())
        # lazily: the weights first, a microbatch's values only if no weight is there (a
        # starred tuple would gather every microbatch's values on every call)
        for x in itertools.chain(self.weight_input.values(), values):
            if isinstance(x.type, TupleType) and x.type.devices == devices:
                return x
        raise TransformError(f"internal: stage {s} has no value to map its constants over")

    def _used_later(self, run: list[Item]) -> set[Value]:
        """The values ``run`` makes that an item outside it reads, or that are kept."""
        inside = set(run)
        return {
            v
            for item in run
            for v in item.outputs
            if v in self._kept or any(r not in inside for r in self._readers.get(v, ()))
        }

    def _scattered(self, v: Value) -> bool:
        """Whether ZeRO-2 (or 3) reduce-scatters each microbatch's ``v`` before summing it."""
        if self.zero < 2:
            return False
        zd = self._zero_axis(self.weight_of_grad.get(self.dplan_source(self._piece_of_final[v])))
        return zd is not None

    def _made(self, v: Value, mb: int, s: int, out: Value) -> None:
        self._put(v, mb, s, out)
        piece_value = self._piece_of_final.get(v)
        if piece_value is None or piece_value not in self.summed:
            return
        if self.zero >= 2:  # ZeRO-2 and 3: each microbatch's gradient reduce-scattered as made
            zd = self._zero_axis(self.weight_of_grad.get(self.dplan_source(piece_value)))
            if zd is not None:
                attributes = {"dim": zd, "op": "sum"}
                name, group = f"{v.name}_mb{mb}_dp", self.grad_group(piece_value)
                out = self.grouped("ReduceScatter", out, attributes, name, group)
        prev = self.acc.get(v)
        if prev is not None:
            out = self._pmap_add(prev, out, v, mb)
        self.acc[v] = out
        if mb == self.m - 1:
            self._reduce_gradient(v, s)

    def _pmap_add(self, a: Value, x: Value, v: Value, mb: int) -> Value:
        body = self._bodies.get(v)
        if body is None:  # one per gradient, shared by its microbatches (of one shape)
            elem = a.type.elements[0].with_device(DeviceVar(VAR))
            body_b = FunctionBuilder(f"{v.name}_acc")
            p = body_b.input(f"{v.name}_acc", elem)
            q = body_b.input(v.name, elem)
            body = body_b.finish(body_b.call("Add", p, q, name=f"{v.name}_sum"))
            self._bodies[v] = body
        names = [f"{v.name}_acc{mb}"]
        return self._add(("pmap", body), "Pmap", [a, x], {"device_var": VAR}, names, body)[0]

    def _reduce_gradient(self, v: Value, s: int, stream: str | None = None) -> None:
        """All-reduce a weight gradient among the replicas holding the same shard (ZeRO-1:
        reduce-scatter it, each replica keeping the part its optimizer-state shard updates;
        ZeRO-2 has reduce-scattered every microbatch's already). Deferred to the end of
        the tasks when the reductions do not overlap the backward (``stream``: then
        ``"compute"``)."""
        if stream is None and self._deferred is not None:
            self._deferred.append((v, s))
            return
        on = {} if stream is None else {"stream": stream}
        piece_value = self._piece_of_final[v]  # each piece output has its own final value
        source = self.dplan_source(piece_value)
        group = self.grad_group(piece_value)
        if source is None or self.group_size(group) == 1:
            return
        zd = self._zero_axis(self.weight_of_grad.get(source))
        if zd is None:
            attributes = {"op": "sum", **on}
            self.acc[v] = self.grouped("AllReduce", self.acc[v], attributes, f"{v.name}_dp", group)
        elif self.zero == 1:
            attributes = {"dim": zd, "op": "sum", **on}
            x = self.acc[v]
            self.acc[v] = self.grouped("ReduceScatter", x, attributes, f"{v.name}_dp", group)

    def grouped(
        self, op_type: str, x: Value, attributes: dict[str, Any], name: str, level: str
    ) -> Value:
        """``op_type`` (a collective) of ``x`` over the groups of mesh axes ``level``, with
        ``attributes`` besides the groups: typed once per (op, attributes, operand type), as
        a step's hundreds of weights of one shape reduce alike (the type rule of a tuple
        checks each of its elements)."""
        key = ("grouped", op_type, level, tuple(sorted(attributes.items())), x.type)
        attributes = {**attributes, "groups": self.groups(level)}
        return self._add(key, op_type, [x], attributes, [name])[0]

    def grad_group(self, piece_value: Value) -> str:
        """The group summing a piece output's gradient (that of its weight, if any)."""
        w = self.weight_of_grad.get(self.dplan_source(piece_value))
        if w is not None and w in self.weight_group:
            return self.weight_group[w]
        return self.grad_level(piece_value)

    def dplan_source(self, piece_value: Value) -> Value | None:
        """The data-plan key a piece output stands for, if it is converted (a gradient)."""
        key = self.key_of.get(piece_value)
        return key if key is not None and key in self._summed_sources else None

    def _emit_conversion(self, item: Item, s: int, mb: int) -> None:
        src, dst = item.src, item.dst
        xs = self.value(item.keys[0], mb, s)
        names = [f"{item.outputs[0].name}_mb{mb}"]
        if item.level == "ep" and self._split_exchange(item):
            self._exchange_split(item, xs, s, mb)
            return
        groups = self.groups(item.level)
        if item.shift:  # a ring step (_megatron_ring): the block of a member s places back
            if src == R:  # the rank's own part first
                (xs,) = self._add(
                    ("keep", item, s),
                    "KeepShard",
                    [xs],
                    {"dim": dst.dim, "groups": groups},
                    [f"{item.outputs[0].name}_own_mb{mb}"],
                )
            op_type, attributes = "RingShift", {"groups": groups, "offset": item.shift}
        elif dst.kind == "S" and src.kind == "S":  # from one split to another: all-to-all
            op_type = "AllToAll"
            attributes = {"split_dim": dst.dim, "concat_dim": src.dim, "groups": groups}
        elif dst == R and src.kind == "S":
            op_type, attributes = "AllGather", {"dim": src.dim, "groups": groups}
        elif dst == R and src.kind in ("P", "M"):  # partial sums, or maxima (M)
            op_type, attributes = (
                "AllReduce",
                {"op": "sum" if src == P else "max", "groups": groups},
            )
        elif dst.kind == "S" and src == P:
            op_type, attributes = "ReduceScatter", {"dim": dst.dim, "op": "sum", "groups": groups}
        elif dst.kind == "S" and src == R:  # into a sequence-parallel region: no transfer
            op_type, attributes = "KeepShard", {"dim": dst.dim, "groups": groups}
        else:
            raise TransformError(
                f"tensor level: no grouped collective turns {src} into {dst} ({item.keys[0].name})"
            )
        # keyed by what fixes the op (its kind, group and operand type), not by the item:
        # every layer's conversion of one shape on a stage is typed once (a type rule of a
        # tuple checks each of its thousands of elements)
        key = ("conversion", op_type, item.src, item.dst, item.level, item.shift, xs.type)
        (out,) = self._add(key, op_type, [xs], attributes, names)
        self._made(item.outputs[0], mb, s, out)

    def _split_exchange(self, item: Item) -> bool:
        """An expert group's all-to-all of a buffer every tensor rank holds whole is sent a
        1/tp slice per tensor rank (of the hidden axis) and all-gathered over the tensor
        ranks after, as Megatron-Core's dispatcher sends each tensor rank's own tokens:
        the expert group's links (often between nodes) carry each token once."""
        if self.tp == 1 or self.hplan.state.get(item.keys[0]) != R:
            return False
        t = self.hplan.local.value(item.keys[0]).type
        dims = {item.src.dim, item.dst.dim}
        return (
            isinstance(t, TensorType)
            and t.rank == 3
            and 2 not in dims
            and t.shape[2] % self.tp == 0
        )

    def _exchange_split(self, item: Item, xs: Value, s: int, mb: int) -> None:
        name, tp = item.outputs[0].name, self.groups("tp")
        a = {"split_dim": item.dst.dim, "concat_dim": item.src.dim, "groups": self.groups("ep")}
        (part,) = self._add(
            ("keep", item, s), "KeepShard", [xs], {"dim": 2, "groups": tp}, [f"{name}_part_mb{mb}"]
        )
        (moved,) = self._add(("a2a", item, s), "AllToAll", [part], a, [f"{name}_moved_mb{mb}"])
        (out,) = self._add(
            ("gather", item, s), "AllGather", [moved], {"dim": 2, "groups": tp}, [f"{name}_mb{mb}"]
        )
        self._made(item.outputs[0], mb, s, out)

    def flat_type(self, local: TensorType, stage: int) -> TupleType:
        """``local`` on each device of ``stage``: made once per (type, pipeline rank), as
        a model's many equal weight and optimizer-state shards of a stage share it."""
        key = (local, stage % self.pp)
        found = self._flat.get(key)
        if found is None:
            devices = self._on.get(stage % self.pp)
            if devices is None:
                devices = self._on[stage % self.pp] = Devices(self.devices(stage))
            # the very tuple a pmap over the stage makes of ``local`` (types.bound_tuple):
            # the type rules of the ops reading it compare it by identity
            found = bound_tuple(local.with_device(_VAR), VAR, devices)
            self._flat[key] = found
        return found


_UNSEEN = object()
_AT, _SENT, _ACC, _FIXED = "at", "sent", "acc", "fixed"  # what a task operand is


def _named(names: list[tuple[str, str]], mb: int) -> list[str]:
    """A task's result names for microbatch ``mb`` (each a prefix and a suffix around it)."""
    return [f"{a}{mb}{b}" for a, b in names]


class _TaskForm:
    """A kind of task written as a Task op: the op (the first microbatch's), its operands'
    and results' roles, its results' names (around the microbatch) and the stages it
    records as its keys' homes."""

    __slots__ = ("homes", "ins", "names", "op", "outs")

    def __init__(self, op: Op, ins: list, outs: list, names: list, homes: tuple) -> None:
        self.op, self.ins, self.outs, self.names, self.homes = op, ins, outs, names, homes


class _Capturing(FunctionBuilder):
    """A task's body: an operand it has not made (a value of the step around it) becomes
    a body input, once (``captured``: the step's value -> the input, in first-use order)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.captured: dict[Value, Value] = {}

    def defines(self, v: Value) -> bool:
        """Whether ``v`` is the body's own (an input or an op's result), not the step's."""
        return v in self._defined

    def _inside(self, inputs: Sequence[Value]) -> list[Value]:
        defined, captured = self._defined, self.captured
        out = []
        for v in inputs:
            if v not in defined:
                found = captured.get(v)
                if found is None:
                    found = captured[v] = self.input(v.name, v.type)
                v = found
            out.append(v)
        return out

    def add_op(self, op_type: str, inputs: Sequence[Value], *args: Any, **kwargs: Any) -> Op:
        return super().add_op(op_type, self._inside(inputs), *args, **kwargs)

    def add_like(self, like: Op, inputs: Sequence[Value], names: Sequence[str]) -> Op:
        return super().add_like(like, self._inside(inputs), names)


_PMAP_ATTRIBUTES = {"device_var": VAR}
_VAR = DeviceVar(VAR)


class _Run:
    """One Pmap step of a task: the keys its body reads, the values it returns (a summed
    gradient's new sum in its place), its body and the result names' prefixes."""

    __slots__ = ("body", "inputs", "key", "prefixes", "results", "summed", "summing")

    def __init__(
        self, inputs: list[Value], results: list[Value], body: Function, summing: tuple, rank: int
    ) -> None:
        self.inputs, self.results, self.body, self.summing = inputs, results, body, summing
        self.key = ("pmap", body, rank)  # (a body of one shape may run on several ranks)
        self.summed = [v in summing for v in results]
        self.prefixes = [f"{v.name}_acc" if v in summing else f"{v.name}_mb" for v in results]
