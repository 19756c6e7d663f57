"""Op families. Importing this package registers every op in ``ir.registry``."""

from __future__ import annotations

from . import (  # noqa: F401
    annotate,
    attention,
    communication,
    compare,
    context,
    control,
    conv,
    conv_grad,
    conv_transpose,
    cross_entropy,
    dropout,
    elementwise,
    embedding,
    kv_cache,
    linalg,
    llama,
    loss,
    moe,
    nn,
    optim,
    p2p,
    pieces,
    pointwise,
    reduce,
    ring,
    shape,
    vocabulary,
)
