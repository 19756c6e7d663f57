"""Op families. Importing this package registers every op in ``ir.registry``."""

from __future__ import annotations

from . import communication, control, elementwise, linalg  # noqa: F401
