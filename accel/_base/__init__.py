"""L0: optional imports, validators, tree walks and the version (stdlib and torch only)."""

from __future__ import annotations

__all__: list[str] = []
