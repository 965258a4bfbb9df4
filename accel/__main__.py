"""``python -m accel ...`` is the ``accel`` command line."""

from __future__ import annotations

from .launch.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    raise SystemExit(main())
