"""The Accelerate boundary: Accelerate's names, module paths, views and refusals over accel.

Only accel's root shims (the modules that carry Accelerate's module paths) and
``accel/__init__`` import this package; the engine below never does (checked by
``tests/unit/test_architecture.py``).
"""

from __future__ import annotations

__all__: list[str] = []
