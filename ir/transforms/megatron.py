"""3D parallelism as Megatron-LM and DeepSpeed arrange it: one steady-state training step.

``megatron(t, dp, tp, pp, microbatches, schedule)`` cuts the model into ``pp``
consecutive layer groups (pipeline stages; ``pp * chunks`` with the
interleaved schedule), runs tensor (Megatron column/row) parallelism inside
each stage over ``tp`` devices, and data parallelism over ``dp`` replicas.
Devices are numbered as Megatron-LM numbers ranks: tensor-parallel peers are
adjacent (they share NVLink), then data-parallel replicas, then stages:
device ``base + s * dp * tp + i * tp + j`` is stage ``s``, replica ``i``, tensor
rank ``j``.

The program is *logical*: every value of a stage is one flat tuple over the
stage's ``dp * tp`` devices, each (stage, microbatch, phase) task runs as
``Pmap`` s over those devices (one body, written once, whatever the number of
devices), tensor-parallel conversions are *grouped* collectives
(``AllReduce(..., groups=[[0, 1], [2, 3]])``: one collective per replica, all at
once), activations move to the next stage with one ``SendEach``, and each
weight's gradient, summed over microbatches, is all-reduced among the replicas
that hold the same shard (``groups=[[0, 2], [1, 3]]``) as soon as its last
microbatch's backward has made it, so it overlaps the rest of the backward
pass. The optimizer then steps every shard on its own device. The op count
grows with layers x microbatches, not with devices.

The step is steady state (DESIGN.md): weights and optimizer state are inputs
on the devices that own them (layouts ``("R@dp", "S(k)@tp")`` or
``("R@dp", "R@tp")``), each batch input arrives split into microbatches and
replicas on the stage that reads it (``("S(0)", "S(0)@dp", "R@tp")``), and the
outputs are the updated shards in the same layouts, the loss as per-replica
partial sums (``"P@dp"``) and batch-shaped outputs in their inputs' layout.
``ir.distribute`` / ``ir.collect`` turn sequential values into these and back.

At the tensor level the embedding, the output head and the cross-entropy are split over
the vocabulary as Megatron-LM splits them (``vocab_parallel=True``, the default; see
:mod:`ir.transforms.vocab_parallel`): each tensor rank holds ``V / tp`` rows of ``wte``
and columns of the head, and no rank makes the whole logits.

Two switches change how the data and tensor levels hold state (``recompute=`` replays
activations as Megatron-LM's ``--recompute-granularity`` does):

* ``zero=1`` / ``zero=2`` (ZeRO, Rajbhandari et al. 2020, as DeepSpeed runs it;
  Megatron-LM's distributed optimizer is stage 1, ``distributed_optimizer=True``): the
  replicas of a shard split its
  optimizer state (layout ``("S(k)@dp", ...)``, along an axis other than the
  tensor-parallel one that divides by ``dp``); the gradient is reduce-scattered
  among them instead of all-reduced, each replica updates its part of the weight
  (``KeepShard``: no transfer) and the parts are all-gathered into the next step's
  replicated weight. Stage 1 reduce-scatters the gradient summed over all
  microbatches, so the whole gradient lives through the accumulation; stage 2
  reduce-scatters every microbatch's gradient as it is made and sums only the
  part (DeepSpeed's ZeRO-2: less memory, one reduce-scatter per microbatch; with
  one microbatch the two stages are the same program). A weight with no such axis
  (a bias split by the tensor level) keeps its state replicated and its gradient
  all-reduced.
* ``sequence_parallel=True`` (Korthikanti et al. 2022): between tensor-parallel
  regions, residual adds and layer norms run on a slice of the tokens each; the
  row-parallel partial sums are reduce-scattered along the tokens instead of
  all-reduced, the token slices all-gathered before each column-parallel MatMul
  and again in the backward pass (the gathered copy is not kept), and a layer
  norm's weight gradient is all-reduced over the tensor group. It needs ``tp > 1``
  (with ``tp = 1`` it changes nothing). The first layer norm, before any
  tensor-parallel region has made a partial sum, runs on all tokens.

:func:`gradient_accumulation` is the one-stage case: microbatches run one after
another (forward then backward each), summing weight gradients before one
optimizer step, so one microbatch's activations live at a time.

Limits (each raises a TransformError naming the level): the batch must divide
into ``dp * microbatches`` equal pieces, tensor-parallel splits must be even and
``tp`` must divide the axis of every split (the attention heads: past them every
tensor rank would repeat the attention; ``allow_replication=True`` builds it
anyway), ``pp`` (times ``chunks``) at most the stages the model's layer and sublayer
boundaries allow (no stage without work), a weight may be read by one stage only (no
tied embeddings across stages), and ops that need the whole batch before the backward
pass (batch norm) cannot be pipelined.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..arguments import bool_arg
from ..function import Function
from ._megatron_plan import MegatronPlan, TensorSplitError
from ._megatron_shared import SharedAnalyses
from ._megatron_update import Megatron3D
from ._rewrite import TransformError, check_common, check_devices
from .pipeline import SCHEDULES
from .tensor_limits import TensorReplicationError


def _positive(name: str, n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise TransformError(f"{name} must be a positive integer, got {n!r}")
    return n


def megatron(
    t: Function,
    dp: int = 1,
    tp: int = 1,
    pp: int = 1,
    microbatches: int = 1,
    schedule: str = "1f1b",
    *,
    chunks: int = 1,
    zero: int = 0,
    sequence_parallel: bool = False,
    devices: Sequence[int] | None = None,
    topology: Any = None,
    stage_of: Mapping[str, int] | None = None,
    allow_replication: bool = False,
    vocab_parallel: bool = True,
    distributed_optimizer: bool = False,
    recompute: str | None = None,
    recompute_layers: int | None = None,
    ep: int = 1,
    cp: int = 1,
    ring_attention: bool = True,
    overlap_grad_reduce: bool = True,
    shared: SharedAnalyses | None = None,
    tasks: bool = False,
) -> Function:
    """``t`` (a training or forward program on one device) as a 3D-parallel steady-state step
    on ``dp * cp * tp * pp`` devices (see the module docstring).

    ``schedule``: ``"gpipe"``, ``"1f1b"`` or ``"interleaved"`` (``chunks`` model chunks
    per pipeline rank, microbatches a multiple of ``pp``). ``zero``: 0, 1 or 2, the ZeRO
    stage of the data level; ``sequence_parallel``: Megatron sequence parallelism at
    the tensor level. ``devices``: the first device id is the base of the numbering
    (default 0). ``stage_of={value_name: stage}`` or ``PipelineStage`` annotations in
    ``t``: the stages (``ir.transforms.stage_cut``); more stages than the model's layers
    and sublayers allow raise a TransformError naming the limit (``pipeline_cut`` says
    where the cut falls). A ``tp`` that leaves whole on every tensor rank a weight that
    tensor parallelism splits (``tp`` beyond the attention heads, or not dividing them,
    the MLP width or the vocabulary) raises a ``TensorSplitError`` naming the limit,
    unless ``allow_replication=True``. ``vocab_parallel`` (default True): the embedding,
    output head and cross-entropy split over the vocabulary at the tensor level
    (``ir.transforms.vocab_parallel``; False keeps them whole on every tensor rank).
    ``distributed_optimizer=True``: Megatron-LM's name for ZeRO stage 1 (``zero=1``).
    ``recompute="selective"`` / ``"full"`` (``--recompute-granularity``) replays
    activations in the backward (``ir.transforms.recompute``); ``recompute_layers=k`` with
    ``"full"``: the first ``k`` layers of each pipeline stage (model chunk, when
    interleaved), as ``--recompute-method block --recompute-num-layers k``.
    ``ep``: expert parallelism (Megatron-Core's, inside data parallelism): each group of
    ``ep`` replicas splits every MoE layer's experts, tokens sent to their experts' ranks
    and back by all-to-alls (``ep`` must divide ``dp`` and the experts). ``cp``: context
    parallelism, each sequence split over ``cp`` devices in zigzag chunks with ring
    attention (``ir.transforms._megatron_context`` and ``_megatron_ring``;
    ``ring_attention=False``: the keys and values all-gathered over the group instead,
    as Llama 3 trains). ``zero=3``: ZeRO stage 3 (fully
    sharded data parallelism: ``ir.transforms._megatron_zero3``).
    ``overlap_grad_reduce`` (default True, as PyTorch DDP and Megatron-LM's
    ``--overlap-grad-reduce`` run it): each gradient's data-parallel reduction starts as
    soon as its last microbatch's backward has made it, overlapping the rest; False: every
    reduction runs after the backward, on the compute stream (``stream="compute"``), as
    Megatron-LM does by default (its DDP all-reduces the gradient buffer once the
    backward of the last microbatch is done, ``finalize_model_grads``).
    ``shared``: a :class:`~ir.transforms._megatron_shared.SharedAnalyses` of ``t`` (after
    ``recompute=``) that several calls share (a search's strategies): the analyses that
    depend only on the tensor degree, the stages and the batch pieces run once for all of
    them; the step is the same as without it.
    ``tasks=True``: each stage's forward and backward of every microbatch but the first
    and the last is one ``Task`` op, its body (the pmaps, collectives and transfers of
    one microbatch's task) written once per stage and phase and applied to each
    microbatch's values: the same program with its repeated tasks named once
    (``ir.transforms.inline_tasks`` writes it out flat; executed and simulated, the two
    are the same to the last bit), a fraction of the ops to build; and the pmap bodies of
    runs of one shape (every layer of a model of equal layers) are one body. It is the
    form for simulating many strategies (``ir.search`` builds it): a body's ops are
    shared, so an event, and a timeline's label or hover text, names the op of the body
    that ran (the first task or layer of its kind), and a replayed forward run may be
    labelled with the backward; read timelines of the flat step (the default).
    """
    check_common("megatron", t, topology, "t")
    overlap_grad_reduce = bool_arg("megatron", "overlap_grad_reduce", overlap_grad_reduce)
    tasks = bool_arg("megatron", "tasks", tasks)
    sequence_parallel = bool_arg("megatron", "sequence_parallel", sequence_parallel)
    allow_replication = bool_arg("megatron", "allow_replication", allow_replication)
    vocab_parallel = bool_arg("megatron", "vocab_parallel", vocab_parallel)
    ring_attention = bool_arg("megatron", "ring_attention", ring_attention)
    distributed_optimizer = bool_arg("megatron", "distributed_optimizer", distributed_optimizer)
    dp = _positive("the data-parallel degree (dp)", dp)
    tp = _positive("the tensor-parallel degree (tp)", tp)
    pp = _positive("the pipeline degree (pp)", pp)
    m = _positive("microbatches", microbatches)
    chunks = _positive("chunks", chunks)
    ep = _positive("the expert-parallel degree (ep)", ep)
    cp = _positive("the context-parallel degree (cp)", cp)
    if dp % ep:
        raise TransformError(
            f"expert level: ep={ep} must divide dp={dp} (expert parallelism splits the experts "
            f"over groups of data-parallel replicas); choose ep dividing {dp}"
        )
    if not isinstance(schedule, str) or schedule not in SCHEDULES:
        raise TransformError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if chunks > 1 and schedule != "interleaved":
        raise TransformError(f"chunks={chunks} needs schedule='interleaved', got {schedule!r}")
    if schedule == "interleaved" and m % pp:
        raise TransformError(
            f"pipeline level: the interleaved schedule takes microbatches in groups of the "
            f"{pp} stages; {m} is not a multiple of {pp}"
        )
    total = dp * cp * tp * pp
    ids = check_devices(devices, total, topology, what="number of devices (dp x cp x tp x pp)")
    base = ids[0]
    if list(ids) != list(range(base, base + total)):
        raise TransformError(f"devices must be consecutive ids, got {list(ids)}")
    if isinstance(zero, bool) or not isinstance(zero, int) or zero not in (0, 1, 2, 3):
        raise TransformError(f"zero must be 0, 1, 2 or 3 (the ZeRO stage), got {zero!r}")
    if shared is not None and not isinstance(shared, SharedAnalyses):
        raise TransformError(
            f"shared must be a SharedAnalyses of the program (or None), got {shared!r}"
        )
    if recompute is not None and shared is not None and shared.program is t:
        raise TransformError(
            f"shared analyses of t with recompute={recompute!r}: the step is built from t's "
            "recomputed program, so the analyses must be of that one: make it first "
            "(step = T.recompute(t, ...)) and pass megatron(step, shared=SharedAnalyses(step)) "
            "without recompute=, or drop shared="
        )
    if recompute is not None:
        from .recompute import mode_activations
        from .recompute import recompute as replay

        values = mode_activations(
            t, recompute, recompute_layers, pp * chunks, stage_of, name="recompute_layers"
        )
        t = replay(t, values)
    elif recompute_layers is not None:
        raise TransformError("recompute_layers= goes with recompute='full'")
    if distributed_optimizer:
        if zero == 2:
            raise TransformError(
                "distributed_optimizer=True is ZeRO stage 1 (Megatron-LM's distributed "
                "optimizer); it contradicts zero=2: pass one of them"
            )
        zero = 1
    step = Megatron3D(
        t,
        dp,
        tp,
        pp,
        m,
        schedule,
        chunks,
        base,
        zero,
        sequence_parallel,
        stage_of,
        allow_replication,
        vocab_parallel=vocab_parallel,
        ep=ep,
        cp=cp,
        ring_attention=ring_attention,
        shared=shared,
    )
    step.as_tasks = tasks
    return step.run(overlap_grad_reduce)


def gradient_accumulation(
    t: Function,
    steps: int,
    *,
    dp: int = 1,
    tp: int = 1,
    zero: int = 0,
    sequence_parallel: bool = False,
    devices: Sequence[int] | None = None,
    topology: Any = None,
    allow_replication: bool = False,
) -> Function:
    """``t``'s step with its batch run as ``steps`` microbatches one after another, each
    one's forward then its backward, the weight gradients summed before one optimizer
    step: the activations of one microbatch live at a time (the one-stage 1F1B
    schedule of :func:`megatron`, whose other options it takes).

    >>> import ir
    >>> from ir.transforms import gradient_accumulation, training
    >>> t = training(ir.models.mlp(8, 4, 4, 2, layers=2))
    >>> g = gradient_accumulation(t, 4)
    >>> g.input_layouts[-1]  # the batch arrives as 4 microbatches (of one replica)
    ('S(0)', 'S(0)@1', 'R@1')
    """
    check_common("gradient_accumulation", t, topology, "t")
    steps = _positive("steps", steps)
    return megatron(
        t,
        dp,
        tp,
        1,
        steps,
        "1f1b",
        zero=zero,
        sequence_parallel=sequence_parallel,
        devices=devices,
        topology=topology,
        allow_replication=allow_replication,
    )


def tensor_split_problem(t: Function, tp: int) -> str | None:
    """Why :func:`megatron` cannot split any weight of ``t`` (a training or forward
    program) over ``tp`` tensor-parallel ranks, or None if it can (or ``tp`` is 1).

    Only the analysis runs (the data and tensor plans of one replica, one stage, one
    microbatch): no program is built. Other problems are not this function's to report.

    >>> import ir
    >>> from ir.transforms import training
    >>> one_layer = training(ir.models.mlp(8, 4, 4, 3, layers=1))  # 3 classes: no 2-way split
    >>> print(tensor_split_problem(one_layer, 2).split(" (")[0])
    tensor level: no weight of mlp splits 2 ways
    >>> tensor_split_problem(training(ir.models.mlp(8, 4, 4, 2, layers=2)), 2) is None
    True
    """
    tp = _positive("the tensor-parallel degree (tp)", tp)
    try:
        MegatronPlan(t, 1, tp, 1, 1, "1f1b", 1, 0, allow_replication=True, checks_only=True)
    except TensorSplitError as e:
        return str(e)
    except TransformError:
        return None  # another level's problem: the strategies that meet it say it
    return None


def tensor_replication_problem(
    t: Function, tp: int, shared: SharedAnalyses | None = None, pieces: int = 1
) -> str | None:
    """Why :func:`megatron` refuses ``tp`` for ``t`` because it would repeat work on every
    tensor rank (``tp`` beyond or not dividing the attention heads, the MLP width, the
    vocabulary: ``ir.transforms.tensor_limits``), or None. The analysis only, as
    :func:`tensor_split_problem`; the same for every dp, pp and microbatch count.
    ``shared``: analyses of ``t`` shared with other calls (see :func:`megatron`);
    ``pieces``: the number of batch pieces (replicas x microbatches) to analyse ``t`` at,
    dividing its batch (the answer is the same for any: a search gives the one its
    estimator analyses, so that the two share the analysis).

    >>> import ir
    >>> from ir.transforms import training
    >>> gpt = training(ir.models.gpt(4, 8, 32, heads=4, vocab=64, layers=1))
    >>> tensor_replication_problem(gpt, 4) is None
    True
    >>> print(tensor_replication_problem(gpt, 8).split(":")[0])
    tensor-parallel degree 8 does not divide the 4 attention heads
    >>> unfused = training(ir.models.gpt(4, 8, 32, 4, 64, 1, attention="unfused"))
    >>> print(tensor_replication_problem(unfused, 8).split(" (")[0])
    tensor level: tp=8 leaves 4 weight(s) that tensor parallelism splits whole on every tensor rank
    """
    tp = _positive("the tensor-parallel degree (tp)", tp)
    pieces = _positive("pieces", pieces)
    try:
        MegatronPlan(t, 1, tp, 1, pieces, "1f1b", 1, 0, shared=shared, checks_only=True)
    except TensorReplicationError as e:
        return str(e)
    except TransformError:
        return None
    return None


__all__ = [
    "TensorReplicationError",
    "TensorSplitError",
    "gradient_accumulation",
    "megatron",
    "tensor_replication_problem",
    "tensor_split_problem",
]
