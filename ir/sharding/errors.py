"""The errors of ``ir.sharding``; each names the value (or ranks) and the rule broken."""

from __future__ import annotations

from ..errors import DistIRError


class ShardingError(DistIRError):
    """Base class of the sharding errors."""


class MeshError(ShardingError):
    """A mesh whose shape and device list disagree, or a device that is not in the mesh."""


class AnnotationError(ShardingError):
    """An impossible annotation: axis out of range, more shards than elements, ..."""


class ConflictingAnnotationError(AnnotationError):
    """One value annotated with two different layouts."""


class PropagationError(ShardingError):
    """Propagation cannot place an op (no sharding rule, or no valid strategy)."""


class LoweringError(ShardingError):
    """A distributed Function that cannot be split into per-rank programs."""


class DeadlockError(ShardingError):
    """Ranked programs that wait on each other forever (or a send nobody receives)."""
