"""Op families. Importing this package registers every op in ``ir.registry``."""

from __future__ import annotations

from . import (  # noqa: F401
    annotate,
    attention,
    communication,
    control,
    conv,
    conv_grad,
    dropout,
    elementwise,
    embedding,
    linalg,
    loss,
    nn,
    optim,
    p2p,
    pieces,
    pointwise,
    reduce,
    shape,
)
