"""The built-in example: what the dashboard opens on, what the report and the strategy
notebook (08) study, so that their numbers are the same.

A GPT *training step* (forward, backward and Adam) over one node of 8 simulated A100s:
data parallelism shows its gradient all-reduces, tensor parallelism its all-reduces per
layer, a pipeline its bubble and the 1F1B order of microbatches; a forward program alone
would show data parallelism with no communication at all.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ir.device import Topology
from ir.function import Function

__all__ = ["EXAMPLE", "ExampleModel", "example_model", "example_topology"]


@dataclass(frozen=True)
class ExampleModel:
    """The example's sizes (a ``ir.models.gpt``), optimizer and hardware."""

    batch: int = 16
    seq: int = 128
    hidden: int = 512
    heads: int = 8
    vocab: int = 4096
    layers: int = 4
    optimizer: str = "adam"
    preset: str = "a100-hgx"
    devices: int = 8

    def describe(self) -> str:
        """``GPT (4 layers, hidden 512, ...) training step with Adam on 8 a100-hgx``."""
        return (
            f"GPT training step ({self.layers} layers, batch {self.batch}, seq {self.seq}, "
            f"hidden {self.hidden}, {self.heads} heads, vocab {self.vocab}; "
            f"{self.optimizer.capitalize()}) on {self.devices} simulated {self.preset} GPUs"
        )


EXAMPLE = ExampleModel()


def example_model(example: ExampleModel = EXAMPLE) -> Function:
    """The example's training step: ``ir.transforms.training(ir.models.gpt(...), "adam")``.

    >>> f = example_model()
    >>> f.name, sum(op.op_type == "Adam" for op in f.ops) > 0
    ('gpt', True)
    """
    from ir import models, transforms

    sizes = {k: v for k, v in asdict(example).items() if k in _GPT_SIZES}
    return transforms.training(models.gpt(**sizes), example.optimizer)


def example_topology(example: ExampleModel = EXAMPLE) -> Topology:
    """The example's hardware: ``Topology.preset("a100-hgx", 8)``."""
    return Topology.preset(example.preset, example.devices)


_GPT_SIZES = ("batch", "seq", "hidden", "heads", "vocab", "layers")
