"""L2 health: stall monitor, attendance, settle and self-test: the probes that read torch or
OS internals."""

from __future__ import annotations

__all__: list[str] = []
