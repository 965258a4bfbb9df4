"""tests/conftest.py's isolation (tests/isolation.py): every test gets ``os.environ`` and a free
torch.distributed default group back whatever the test before it did, unit tests cannot start a
process, and each test is marked with the cost tier of its folder.

The two ``test_leak_*`` / ``test_*_restored`` pairs rely on pytest running a file's tests in
order: the first leaks on purpose, the next checks conftest undid it.
"""

from __future__ import annotations

import doctest
import multiprocessing as mp
import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import isolation
from tests.isolation import LeakedProcessGroupWarning, tear_down_process_group, tier_of

ADDED, CHANGED, DELETED = "ACCEL_TEST_ISOLATION_ADDED", "ACCEL_TEST_ISOLATION_CHANGED", \
    "ACCEL_TEST_ISOLATION_DELETED"
MOVE = r"Move it to tests/distributed/<package>/.*or to tests/e2e/<package>/"


@pytest.fixture(scope="module")
def preset() -> Iterator[None]:
    """Two variables set before the per-test snapshot (module scope is set up first)."""
    os.environ[CHANGED], os.environ[DELETED] = "before", "present"
    yield
    os.environ.pop(CHANGED, None)
    os.environ.pop(DELETED, None)


def _start_group() -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def test_leak_environment_changes(preset: None) -> None:
    os.environ[ADDED] = "1"
    os.environ[CHANGED] = "after"
    del os.environ[DELETED]


def test_environment_restored(preset: None) -> None:
    assert ADDED not in os.environ
    assert os.environ[CHANGED] == "before" and os.environ[DELETED] == "present"


@pytest.mark.filterwarnings("ignore::tests.isolation.LeakedProcessGroupWarning")
def test_leak_a_process_group() -> None:
    import torch.distributed as dist

    _start_group()
    assert dist.is_initialized()


def test_process_group_destroyed() -> None:
    import torch.distributed as dist

    assert not dist.is_initialized()
    _start_group()  # the default group can be created again: the old one was destroyed
    dist.destroy_process_group()


def test_a_leaked_group_is_destroyed_with_a_warning_naming_the_test() -> None:
    import torch.distributed as dist

    _start_group()
    with pytest.warns(LeakedProcessGroupWarning, match=r"^tests/x\.py::test_y left a torch\."
                      r"distributed default process group.*destroy_process_group\(\)"):
        assert tear_down_process_group("tests/x.py::test_y") is True
    assert not dist.is_initialized()
    assert tear_down_process_group("tests/x.py::test_y") is False  # nothing left: no warning


def test_teardown_imports_nothing_where_the_test_did_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch.distributed", raising=False)
    assert tear_down_process_group("t") is False
    assert "torch.distributed" not in sys.modules


def test_unit_tests_cannot_start_a_subprocess(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("unit") is not None
    with pytest.raises(pytest.fail.Exception, match=MOVE) as failed:
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert str(failed.value).startswith(f"{request.node.nodeid} is a unit test but starts a "
                                        "process (subprocess.Popen)")
    with pytest.raises(pytest.fail.Exception, match=r"\(os\.system\)"):
        os.system("true")


def test_unit_tests_cannot_start_a_multiprocessing_process() -> None:
    for method in ("spawn", "fork"):
        proc = mp.get_context(method).Process(target=print)  # type: ignore[attr-defined]
        with pytest.raises(pytest.fail.Exception, match=r"multiprocessing Process\.start.*" + MOVE):
            proc.start()


def test_unit_tests_cannot_fork() -> None:
    with pytest.raises(pytest.fail.Exception, match=r"\(os\.fork\).*" + MOVE):
        pid = os.fork()
        if pid == 0:  # only if the guard failed: the child must not run the rest of pytest
            os._exit(0)
        os.waitpid(pid, 0)


def test_the_processor_name_is_known_before_unit_tests_start() -> None:
    """platform.processor() runs `uname -p` on its first call; conftest makes that call first."""
    platform.processor()  # accel's CPU device report asks this in unit tests


def test_tier_of_each_folder() -> None:
    tests = Path("/repo/tests")
    assert {folder: tier_of(tests / folder / "pkg" / "test_x.py", tests)
            for folder in ("unit", "distributed", "e2e", "compat", "cuda", "xla")} == {
        "unit": "unit", "distributed": "multiprocess", "e2e": "e2e", "compat": "e2e",
        "cuda": "multiprocess", "xla": "e2e"}
    assert tier_of(tests / "spawn.py", tests) is None  # a helper module, not in a tier folder
    assert tier_of(tests / "scripts" / "test_x.py", tests) is None
    assert doctest.testmod(isolation).failed == 0


def test_this_file_is_marked_unit_and_only_unit(request: pytest.FixtureRequest) -> None:
    marks = {m.name for m in request.node.iter_markers()} & {"unit", "multiprocess", "e2e"}
    assert marks == {"unit"}
