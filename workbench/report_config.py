"""What ``python -m workbench report`` simulates (:class:`ReportConfig`) and the model it
builds: light to import (no plotly, no Jupyter), so that the command line answers ``--help``
at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from ir.errors import DistIRError
from ir.function import Function

from .example import EXAMPLE

__all__ = ["DEFAULT_STRATEGIES", "OPTIMIZERS", "ReportConfig", "build_model"]

DEFAULT_STRATEGIES = ("dp=8", "dp=2,hp=2,pp=2,microbatches=4,schedule=1f1b")
OPTIMIZERS = ("adam", "sgd")


@dataclass(frozen=True)
class ReportConfig:
    """What ``python -m workbench report`` simulates; every field has a default: the
    built-in example's (:mod:`workbench.example`), the dashboard's subject.

    ``search``: also search every dp x tp x pp of the devices (1F1B pipelines,
    power-of-two microbatches; see :func:`ir.search.search`) and show its Pareto front.
    ``measure``: also run each strategy over at most 4 devices on gloo processes of this
    CPU and show it against the simulator (:func:`workbench.measuring.measure_part`;
    small models only).
    """

    model: str = "gpt"
    batch: int = EXAMPLE.batch
    seq: int = EXAMPLE.seq
    hidden: int = EXAMPLE.hidden
    heads: int = EXAMPLE.heads
    vocab: int = EXAMPLE.vocab
    layers: int = EXAMPLE.layers
    features: int = 512
    classes: int = 64
    training: bool = True
    optimizer: str = EXAMPLE.optimizer
    preset: str = EXAMPLE.preset
    devices: int = EXAMPLE.devices
    strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    search: bool = True
    measure: bool = False

    @property
    def is_file(self) -> bool:
        """``model`` names an ONNX file rather than a built-in model."""
        return self.model.endswith(".onnx")

    def describe_model(self) -> str:
        """``GPT: 4 layers, batch 16, seq 128, hidden 512, 8 heads, vocab 4096, training step
        (adam)``."""
        mode = f"training step ({self.optimizer})" if self.training else "forward"
        if self.is_file:
            return f"{self.model} (ONNX), its program as written"
        if self.model == "gpt":
            return (
                f"GPT: {self.layers} layers, batch {self.batch}, seq {self.seq}, hidden "
                f"{self.hidden}, {self.heads} heads, vocab {self.vocab}, {mode}"
            )
        return (
            f"MLP: {self.layers} layers, batch {self.batch}, features {self.features}, "
            f"hidden {self.hidden}, classes {self.classes}, {mode}"
        )


def build_model(config: ReportConfig) -> Function:
    """The model ``config`` names, from ``ir.models`` or an ONNX file (``ir.from_onnx``)."""
    from ir import models, transforms

    if config.optimizer not in OPTIMIZERS:
        raise DistIRError(
            f"unknown optimizer {config.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}"
        )
    if config.is_file:  # its sharding annotations are the session's business: dropped here
        from .imported import load_onnx

        return load_onnx(config.model)[0]
    if config.model == "gpt":
        forward = models.gpt(
            config.batch, config.seq, config.hidden, config.heads, config.vocab, config.layers
        )
    elif config.model == "mlp":
        forward = models.mlp(
            config.batch, config.features, config.hidden, config.classes, layers=config.layers
        )
    else:
        raise DistIRError(f"unknown model {config.model!r}; choose gpt, mlp or a .onnx file")
    return transforms.training(forward, config.optimizer) if config.training else forward
