from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _has_cuda() -> bool:
    from accel.device.cuda import CUDADevice

    return CUDADevice.count() > 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any("cuda" in item.keywords for item in items) and not _has_cuda():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU; none is visible on this machine "
                                "(run on a device machine: pytest -m cuda)")
        for item in items:
            if "cuda" in item.keywords:
                item.add_marker(skip)
