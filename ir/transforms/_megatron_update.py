"""The end of :func:`ir.transforms.megatron`'s step: every stage's optimizer steps (one
``Pmap`` per stage; under ZeRO each replica updates its part of a weight and the parts
are all-gathered) and the step's outputs with their layouts.
"""

from __future__ import annotations

from dataclasses import replace

from ..builder import FunctionBuilder
from ..function import Function
from ..layout import with_layouts
from ..op import Op
from ..registry import get_op
from ..types import DeviceVar
from ..value import Value
from ._emit import carried_inputs
from ._megatron_plan import VAR, level
from ._megatron_stages import StageEmission
from ._rewrite import localize_op
from ._spmd import P, R


class Megatron3D(StageEmission):
    """The whole step: :meth:`run` returns it."""

    def run(self, overlap_grad_reduce: bool = True) -> Function:
        """The step: inputs, every stage's tasks in schedule order, optimizer steps, outputs.
        ``overlap_grad_reduce=False``: the gradients' data-parallel reductions after every
        task, on the compute stream (:func:`ir.transforms.megatron`)."""
        self._deferred: list[tuple[Value, int]] | None = None if overlap_grad_reduce else []
        self._emit_inputs()
        self._merge()
        for v, s in self._deferred or ():  # after the backward, in the order made
            self._reduce_gradient(v, s, stream="compute")
        outs, out_layouts = self._optimizer_and_outputs()
        # (the builder has checked every op as it was added, and finish() the outputs)
        g = with_layouts(self.b.finish(outs), self.layouts, out_layouts)
        # Every device of a stage runs the same pmaps and takes part in the same grouped
        # collectives and sends: one rank class per pipeline rank.
        classes = tuple(tuple(self.devices(rank)) for rank in range(self.pp))
        return replace(g, rank_classes=tuple(c for c in classes if len(c) > 1))

    # -- optimizer and outputs -------------------------------------------------------------

    def _optimizer_and_outputs(self) -> tuple[list[Value], list]:
        t, dplan = self.t, self.dplan
        self._post_making: dict[Value, Op] = {}  # each optimizer result -> its step
        for op in self.post:
            for out in op.outputs:
                self._post_making.setdefault(out, op)
        glob: dict[Value, Value] = {}
        final_piece_of = {k: p for p, k in self.key_of.items() if p in self.final}
        for dst, st in self.conv_dst.items():
            src = st.keys[0]
            piece_value = final_piece_of.get(src)
            if piece_value is None:
                continue
            h = self.final[piece_value]
            if st.src == P:
                glob[dst] = self.acc[h]
        for v in t.inputs:
            if v in self.weight_input:
                glob[v] = self.weight_input[v]
                zd = self._zero_axis(v) if self.zero < 3 else None
                if zd is not None:  # ZeRO: each replica updates its part of the weight
                    axes = self.weight_group[v]
                    glob[v] = self.grouped("KeepShard", glob[v], {"dim": zd}, f"{v.name}_z", axes)
        by_stage: dict[int, list[Op]] = {}
        for op in self.post:
            by_stage.setdefault(self.stage_of_post[op], []).append(op)
        for s, ops in sorted(by_stage.items()):
            inputs: list[Value] = []
            made: set[Value] = set()
            for op in ops:
                for k in self.post_keys[op]:
                    if k not in made and k not in inputs:
                        inputs.append(k)
                made.update(op.outputs)
            body_b = FunctionBuilder(f"{t.name}_update_s{s}")
            env = {
                k: body_b.input(k.name, glob[k].type.elements[0].with_device(DeviceVar(VAR)))
                for k in inputs
            }
            for op in ops:
                ins = [env[k] for k in self.post_keys[op]]
                outs = localize_op(body_b, op, ins, DeviceVar(VAR))
                env.update(zip(op.outputs, outs))
            results = [v for op in ops for v in op.outputs]
            body = body_b.finish([env[v] for v in results])
            pm = self.b.add_op(
                "Pmap",
                [glob[k] for k in inputs],
                {"device_var": VAR},
                names=[v.name for v in results],
                subfunctions=[body],
            )
            glob.update(zip(results, pm.outputs))
            for op in ops:  # ZeRO: the replicas gather the updated parts of each weight
                zd = self._zero_axis(self.post_keys[op][0]) if self.zero < 3 else None
                if zd is not None:
                    w1 = op.outputs[0]
                    axes = self.weight_group[self.post_keys[op][0]]
                    glob[w1] = self.grouped("AllGather", glob[w1], {"dim": zd}, w1.name, axes)
        outs, layouts = [], []
        # With one batch piece (dp = microbatches = 1) the data level sums nothing, so the
        # optimizer steps run inside the piece: their results are the next step's inputs
        # all the same, returned in those inputs' layouts (not as one microbatch's outputs).
        updates = carried_inputs(t) if self.dp * self.m == 1 else {}
        for v in t.outputs:
            key = dplan.current[v]
            if key in glob:
                outs.append(glob[key])
                layouts.append(self._update_layout(key))
                continue
            piece_value = next(p for p in self.piece_out if self._piece_key(p) is key)
            h = self.final[piece_value]
            hstate = self.hplan.state[h]
            if piece_value in self.summed:
                outs.append(self.acc[h])
                layouts.append(self._summed_layout(piece_value, level(hstate, self.tp)))
            elif v in updates:  # one piece: its optimizer steps ran in it (no sum to wait for)
                outs.append(self.at[0][h])
                layouts.append(self.layouts[updates[v].name])
            else:
                per_mb = [self.at[mb][h] for mb in range(self.m)]
                outs.append(self.b.call("MakeTuple", *per_mb, name=v.name))
                layout = self.batch_layout(level(hstate, self.tp), piece_value)
                if dplan.state[key] in (R, None):  # made by every piece (a scalar of no row)
                    layout = ("R", f"R@{self.dp}", *layout[2:])
                layouts.append(layout)
        return outs, layouts

    def _summed_layout(self, piece_value: Value, tp_level: str) -> tuple[str, ...]:
        """The layout of an output summed over microbatches: a weight gradient is
        all-reduced among the replicas of its group (``R``) or, under ZeRO, reduce-scattered
        (``S(k)``), as ``_reduce_gradient`` does; anything else (the loss) stays their
        partial sums (``P``). Fuzzing found gradients returned (``return_gradients``)
        labelled ``P``: ``ir.collect`` summed dp full copies, dp times the gradient."""
        source = self.dplan_source(piece_value)
        group = self.grad_group(piece_value)
        if source is None or self.group_size(group) == 1 == self.cp:
            cp = (f"{self.level_state('cp', piece_value).kind}@{self.cp}",) if self.cp > 1 else ()
            return (f"P@{self.dp}", *cp, tp_level)
        w = self.weight_of_grad.get(source)
        zd = self._zero_axis(w)
        dp_level = "R" if zd is None or self.group_size(group) == 1 else f"S({zd})"
        ep_state = "S(0)" if self.level_state("ep", piece_value).kind == "S" else "R"
        return self.weight_layout(dp_level, tp_level, group, ep_state)

    def _update_layout(self, key: Value) -> tuple[str, ...] | None:
        """The layout of an optimizer result: that of the input it is the next step's
        value of (result 0 the parameter, then the state operands in order)."""
        op = self._post_making.get(key)
        if op is None:
            return None
        opdef = get_op(op.op_type)
        updated = [0, *(opdef.operands.index(n) for n in opdef.extra.get("state", ()))]
        i = op.outputs.index(key)
        source = self.post_keys[op][updated[i]] if i < len(updated) else self.post_keys[op][0]
        return self.layouts.get(source.name)

    def _piece_key(self, p: Value) -> Value | None:
        return self.key_of.get(p)
