"""Horovod's own PyTorch tests (``test/test_torch.py`` of the horovod 0.20.2 sdist), with only
their imports swapped to ``accel.horovod``, on 2 processes under ``accel launch``.

:mod:`tests.compat.horovod_suite` fetches the pinned sdist, ports the file and runs it. Every
test must pass on both ranks (or skip for a reason Horovod's own CPU runs skip it for: no GPU,
NCCL, MPI...), except those in ``horovod_suite_known.json``, each with the cause it fails for
(``departure:`` marks a deliberate difference; ``unstable:`` a test whose outcome depends on
timing, which may pass). Regenerate with ``python -m
tests.compat.horovod_suite --write-known`` after fixing causes; a listed test that starts to
pass fails this test too, so the list only shrinks and stays true.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.compat.horovod_suite import CPU_SKIPS, KNOWN, port_source, run_suite

pytestmark = pytest.mark.slow


def test_port_changes_imports_only() -> None:
    source = ("import horovod.torch as hvd\nfrom horovod.torch.mpi_ops import synchronize\n"
              "from common import mpi_env_rank_and_size, temppath\n"
              "from distutils.version import LooseVersion\nx = inspect.getargspec(f).args\n")
    ported = port_source(source, distutils=True, getargspec=True).splitlines()
    assert ported == ["import accel.horovod as hvd", "from accel.horovod import synchronize",
                      "from tests.compat.horovod_suite_common import mpi_env_rank_and_size, "
                      "temppath", "from distutils.version import LooseVersion",
                      "x = inspect.getargspec(f).args"]
    old_python = port_source(source, distutils=False, getargspec=False).splitlines()
    assert old_python[3] == "from tests.compat.horovod_suite_common import LooseVersion"
    assert old_python[4] == "x = inspect.getfullargspec(f).args"


def test_horovod_suite_passes_under_accel_but_for_the_known_causes() -> None:
    known: dict[str, str] = json.loads(KNOWN.read_text())
    results = run_suite(test_timeout=15, total_timeout=400)
    passed = {name for name, outcome in results.items() if outcome == "passed"}
    cpu_skips = {name for name, outcome in results.items()
                 if outcome.startswith("skipped") and CPU_SKIPS.search(outcome)}
    print(f"Horovod's test_torch.py under accel.horovod: {len(passed)} of "
          f"{len(results) - len(cpu_skips)} pass ({len(cpu_skips)} skip on CPU, "
          f"{len(known)} known failures)")
    broken = {name: outcome for name, outcome in sorted(results.items())
              if name not in passed | cpu_skips | set(known)}
    assert not broken, ("these tests of Horovod's test_torch.py fail under accel.horovod and "
                        f"are not in {KNOWN.name}:\n{json.dumps(broken, indent=1)}")
    # "unstable:" entries pass or fail with the machine's timing (their reason says why)
    fixed = sorted(name for name in set(known) & passed
                   if not known[name].startswith("unstable:"))
    assert not fixed, (f"these now pass: delete them from {KNOWN.name} (python -m "
                       "tests.compat.horovod_suite --write-known):\n" + "\n".join(fixed))
    stale = sorted(set(known) - set(results))
    assert not stale, f"not in Horovod's file any more: {stale}"
    total = len(results) - len(cpu_skips)
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    figures = f"{total - len(known)} of the {total} tests it runs on a CPU pass"
    assert figures in " ".join(readme.split()), f"README's Horovod figures are stale: {figures!r}"
