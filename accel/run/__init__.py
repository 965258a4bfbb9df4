"""L4: the run: connector (settings to runtime), run state, prepare, step, wrappers, rng,
memory, progress and gradient accumulation."""

from __future__ import annotations

__all__: list[str] = []
