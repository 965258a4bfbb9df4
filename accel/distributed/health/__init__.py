"""L2 health: the probes that read torch or OS internals, one module each, each pinned against
the installed torch and kernel by tests/unit/distributed/health/test_pins.py: the stall monitor
(``stall``, ``stall_report``), store-based attendance (``attendance``), thread settling through
``/proc`` (``settle``), torchelastic's restart record and frames (``elastic``, used lazily by
``accel launch``) and the worker side of ``accel test`` (``selftest``)."""

from __future__ import annotations

__all__: list[str] = []
