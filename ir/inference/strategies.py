"""Serving strategies: tensor parallelism, a pipeline over layers, and replicas.

A :class:`ServingStrategy` is a small frozen record, like a training strategy: ``tp``
devices split each layer (Megatron-LM's column and row split; attention by heads, each
device keeping the KV cache of its key/value heads), ``pp`` pipeline stages split the
layers (each stage keeps its layers' caches), and ``replicas`` copies of that serve
separate requests (data parallelism over requests: nothing is communicated between
replicas). :func:`parallel_step` builds the step with ``ir.transforms.megatron``
(``dp = replicas``); a decode step over ``pp > 1`` stages runs ``pp`` microbatches, as
pipelined serving engines keep ``pp`` batches in flight.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import DistIRError
from ..function import Function
from ..transforms import megatron
from .steps import ServingError, analyse


def _positive(what: str, n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ServingError(f"{what} must be a positive integer, got {n!r}")
    return n


@dataclass(frozen=True)
class ServingStrategy:
    """``tp``-way tensor parallelism inside ``pp`` pipeline stages, ``replicas`` times.

    >>> ServingStrategy(tp=4, pp=2), ServingStrategy(2, replicas=4).devices
    (ServingStrategy('tp4 pp2'), 8)
    """

    tp: int = 1
    pp: int = 1
    replicas: int = 1

    def __post_init__(self) -> None:
        for what in ("tp", "pp", "replicas"):
            _positive(what, getattr(self, what))

    @property
    def devices(self) -> int:
        """GPUs in all: ``tp * pp * replicas``."""
        return self.tp * self.pp * self.replicas

    @property
    def replica_devices(self) -> int:
        """GPUs of one replica: ``tp * pp``."""
        return self.tp * self.pp

    @property
    def label(self) -> str:
        parts = [f"tp{self.tp}"]
        if self.pp > 1:
            parts.append(f"pp{self.pp}")
        if self.replicas > 1:
            parts.append(f"x{self.replicas}")
        return " ".join(parts)

    def __repr__(self) -> str:
        return f"ServingStrategy({self.label!r})"

    @staticmethod
    def parse(text: str) -> ServingStrategy:
        """``"tp4 pp2 x1"`` (any order; missing degrees are 1) as a strategy."""
        degrees = {"tp": 1, "pp": 1, "x": 1}
        for word in str(text).split():
            key = next((k for k in degrees if word.startswith(k)), None)
            if key is None or not word[len(key) :].isdigit():
                raise ServingError(
                    f"cannot read {word!r} in strategy {text!r}: write e.g. 'tp4 pp2 x1'"
                )
            degrees[key] = int(word[len(key) :])
        return ServingStrategy(degrees["tp"], degrees["pp"], degrees["x"])


def check_strategy(forward: Function, strategy: ServingStrategy) -> None:
    """Refuse a strategy the model cannot take, naming the limit and by how much: a
    tensor-parallel degree that does not divide the (key/value) heads, more stages than
    layers."""
    a = analyse(forward)
    tp = strategy.tp
    for op, layer in zip(a.attention, a.layers):
        heads = op.inputs[0].type.shape[1]  # type: ignore[union-attr]
        for what, n in (("key/value heads", layer.kv_heads), ("attention heads", heads)):
            if what.startswith("key") and n == 1:
                continue  # one kv head (MQA): every device keeps it
            if n % tp:
                fits = [d for d in range(1, n + 1) if n % d == 0]
                raise ServingError(
                    f"tensor-parallel degree {tp} does not divide the {n} {what} (layer "
                    f"{layer.layer}: {n} = {n // tp} x {tp} + {n % tp}, {n % tp} left over); "
                    f"each device serves whole heads: use tp in {fits}"
                )
    if strategy.pp > len(a.layers):
        raise ServingError(
            f"{strategy.pp} pipeline stages exceed the model's {len(a.layers)} layers by "
            f"{strategy.pp - len(a.layers)}"
        )


def microbatches(strategy: ServingStrategy, batch: int, decode: bool) -> int:
    """Microbatches a step of ``batch`` sequences runs per replica: ``pp`` for a pipelined
    decode (one batch in flight per stage), one otherwise (a prompt's prefill passes the
    stages once)."""
    if strategy.pp == 1 or not decode:
        return 1
    if batch % strategy.pp:
        raise ServingError(
            f"a decode batch of {batch} sequences does not split into {strategy.pp} "
            f"microbatches (one per pipeline stage in flight): {batch % strategy.pp} left "
            f"over; use a multiple of {strategy.pp}"
        )
    return strategy.pp


def parallel_step(
    step: Function, strategy: ServingStrategy, *, decode: bool | None = None, replicas: bool = True
) -> Function:
    """``step`` (from :func:`ir.inference.prefill_step` or ``decode_step``) as the strategy's
    steady-state program: weights and caches resident on their devices (caches split by
    kv heads over ``tp`` and by layers over ``pp``), ``replicas`` copies over the batch
    (``replicas=False``: one replica's program, as the metrics simulate it).
    ``decode`` (None: a step of one new position) runs ``pp`` microbatches."""
    tokens = next(v for v in step.inputs if v.name == "tokens")
    batch, new = tokens.type.shape  # type: ignore[union-attr]
    decode = new == 1 if decode is None else decode
    dp = strategy.replicas if replicas else 1
    if batch % dp:
        raise ServingError(
            f"a batch of {batch} sequences does not split over {dp} replicas "
            f"({batch % dp} left over)"
        )
    m = microbatches(strategy, batch // dp, decode)
    try:
        return megatron(step, dp, strategy.tp, strategy.pp, m)
    except ServingError:
        raise
    except DistIRError as e:
        raise ServingError(f"{strategy.label}: {e}") from None


def strategies(forward: Function, devices: int) -> Iterator[ServingStrategy]:
    """Every strategy of ``devices`` GPUs the model takes (tp dividing its heads and
    kv heads, at most as many stages as layers), fewest replicas first."""
    a = analyse(forward)
    for tp in range(1, devices + 1):
        for pp in range(1, devices // tp + 1):
            if devices % (tp * pp):
                continue
            s = ServingStrategy(tp, pp, devices // (tp * pp))
            try:
                check_strategy(forward, s)
            except ServingError:
                continue
            if pp <= len(a.layers):
                yield s
