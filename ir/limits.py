"""DistIR's size limits, in one place (docs/text-format.md lists them).

Beyond these a program is refused with a located error rather than left to exhaust
memory, recursion or time: the checks sit where each thing is made (the lexer, the
term parser, :class:`ir.types.TensorType` and :class:`ir.types.TupleType`, the Pmap
type rule), and each message names the limit it hit.
"""

from __future__ import annotations

MAX_TEXT_NESTING = 100
"""Brackets (``( [ {``) open at once in program text."""

MAX_INT = 2**63 - 1
"""The largest integer literal, size, dimension or integer attribute (int64's largest)."""

MAX_ELEMENTS = 2**48
"""Elements of one tensor (2.8e14, a petabyte at float32: beyond any device)."""

MAX_DEVICES = 2**16
"""Devices a program may name: device ids are ``0 .. MAX_DEVICES - 1``; a device range
(``[1..N]``), a ``Tuple[..., N]`` or any tuple has at most this many items."""

MAX_TOPOLOGY_DEVICES = 4096
"""Devices of an :class:`ir.Topology` given dense link matrices, whose checks are quadratic
in devices (4096: 16.8 million links, seconds). Links given by a rule
(:class:`ir.device.LinkTable`, as ``Topology.uniform`` and the presets give them) are
checked in constant time and go to ``MAX_DEVICES``."""

MAX_TUPLE_NESTING = 32
"""Tuples inside tuples (``Tuple[Tuple[...]]``)."""

MAX_PMAP_NESTING = 8
"""Pmaps inside pmap bodies."""
