"""The strategy-independent analyses of one program, shared by the 3D steps built from it.

A search builds many :func:`ir.transforms.megatron` steps of one training program. Much of
each step's analysis (:class:`ir.transforms._megatron_plan.MegatronPlan`) depends on a few
of the strategy's values only: the vocabulary-parallel form on the ops it rewrites (the
same for every tensor degree that rewrites them), the pipeline cut on the number of
stages, the data level (:mod:`ir.transforms._megatron_piece`) on the number of batch
pieces (replicas x microbatches; shared by every cut that changes none of the program's
ops), the tensor plan on that and the tensor degree. :class:`SharedAnalyses` holds those
results, keyed by exactly the values that determine them, for one program and one search
request; it is made by the caller and dropped with it (no global state). Each result is
read, never changed, by the plans that use it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

from ..function import Function

T = TypeVar("T")


class SharedAnalyses:
    """Analyses of ``program`` (the step :func:`ir.transforms.megatron` is given) shared by
    the plans of one search: ``get(key, make)`` runs ``make`` once per ``key``. A key names
    every value the result depends on (the stages of a cut, the pieces of a data plan, the
    keys of the analyses it starts from); a failed analysis is not kept (it raises again)."""

    def __init__(self, program: Function) -> None:
        self.program = program
        self._results: dict[Hashable, object] = {}

    def get(self, key: Hashable, make: Callable[[], T]) -> T:
        if key not in self._results:
            self._results[key] = make()
        return self._results[key]  # type: ignore[return-value]

    def __len__(self) -> int:
        return len(self._results)
