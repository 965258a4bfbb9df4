"""Shared hooks and fixtures for every test tier (see tests/isolation.py for the tiers).

* Each test gets the cost-tier marker of its folder: ``pytest -m unit``, ``-m multiprocess`` and
  ``-m e2e`` select a tier (``cuda``, ``xla`` and ``slow`` still mark what they did).
* After every test ``os.environ`` is exactly what it was before, and a torch.distributed default
  process group the test left initialised is destroyed (with a warning naming the test).
* Unit tests cannot start processes.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.isolation import (  # noqa: E402  (needs ROOT on sys.path)
    forbid_process_starts,
    restore_environ,
    tear_down_process_group,
    tier_of,
)

TESTS = Path(__file__).resolve().parent

# The standard library runs `uname -p` the first time platform.processor() is called (then caches
# it); accel's CPU device report calls it. Run it now, before unit tests forbid starting processes,
# so that whichever test happens to call it first does not fail.
platform.processor()


def _has_cuda() -> bool:
    from accel.device.cuda import CUDADevice

    return CUDADevice.count() > 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(Path(item.path).resolve(), TESTS)
        if tier is not None:
            item.add_marker(tier)
    if any("cuda" in item.keywords for item in items) and not _has_cuda():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU; none is visible on this machine "
                                "(run on a device machine: pytest -m cuda)")
        for item in items:
            if "cuda" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def _restore_environ() -> Iterator[None]:
    """``os.environ`` after the test is exactly what it was before it."""
    saved = dict(os.environ)
    yield
    restore_environ(saved)


@pytest.fixture(autouse=True)
def _no_leaked_process_group(request: pytest.FixtureRequest) -> Iterator[None]:
    """Destroy a default process group the test left behind, warning which test leaked it."""
    yield
    tear_down_process_group(request.node.nodeid)


@pytest.fixture(autouse=True)
def _unit_tests_start_no_processes(request: pytest.FixtureRequest,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """In the unit tier, starting a process fails the test and says where to move it."""
    if request.node.get_closest_marker("unit") is not None:
        forbid_process_starts(monkeypatch, request.node.nodeid)
