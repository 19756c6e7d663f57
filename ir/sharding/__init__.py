"""Sharding: annotations, propagation, redistribution and ranked per-device lowering.

* :class:`ShardingSpec` (ONNX, seed 001) and :class:`Mesh` + placements
  :data:`S`, :data:`R`, :data:`P` (DTensor, seed 004), with :class:`Layout`
  joining a mesh and its placements; both split and merge numpy arrays.
* :func:`propagate` derives a layout for every value from a few annotations
  and returns an explicit distributed Function plus a report of the
  redistributions it inserted: a steady-state step, one ``Pmap`` per op that
  every device runs alike; :func:`fuse_pmaps` writes runs of them as one body
  (a compact text to read). :class:`ProgramFacts` holds a program's
  mesh-independent facts (each op's rule and signature): keep one per program
  propagated repeatedly and pass it as ``propagate(..., facts=...)``.
* :func:`lower_to_ranks` splits a distributed Function into one program per
  rank (deduplicated), :func:`run_ranked` executes them together exchanging
  messages, :func:`check_deadlock` finds a cycle of waits.
"""

from __future__ import annotations

from . import lower_comm  # noqa: F401  (attaches each communication op's lower_rule)
from .annotations import annotate
from .errors import (
    AnnotationError,
    ConflictingAnnotationError,
    DeadlockError,
    LoweringError,
    MeshError,
    PropagationError,
    ShardingError,
)
from .facts import ProgramFacts
from .lower import Binding, RankedProgram, lower_to_ranks
from .mesh import Layout, Mesh, P, Partial, Placement, R, Replicate, S, Shard, placement
from .propagate import InsertedCollective, PropagationReport, propagate
from .ranked import Matching, check_deadlock, run_ranked, schedule
from .spec import ShardingSpec
from .spmd import fuse_pmaps
from .stages import annotate_stages, pipeline_stages, place_stages, stage_marks, strip_stages

__all__ = [
    "AnnotationError",
    "Binding",
    "ConflictingAnnotationError",
    "DeadlockError",
    "InsertedCollective",
    "Layout",
    "LoweringError",
    "Matching",
    "Mesh",
    "MeshError",
    "P",
    "Partial",
    "Placement",
    "ProgramFacts",
    "PropagationError",
    "PropagationReport",
    "R",
    "RankedProgram",
    "Replicate",
    "S",
    "Shard",
    "ShardingError",
    "ShardingSpec",
    "annotate",
    "annotate_stages",
    "check_deadlock",
    "fuse_pmaps",
    "lower_to_ranks",
    "pipeline_stages",
    "place_stages",
    "placement",
    "propagate",
    "run_ranked",
    "schedule",
    "stage_marks",
    "strip_stages",
]
