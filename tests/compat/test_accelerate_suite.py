"""Hugging Face Accelerate's own pytest suite, with only its imports swapped to accel.

:mod:`tests.compat.suite` fetches the top-level ``tests/*.py`` of the pinned accelerate sdist,
swaps the imports and runs each file in its own pytest process. The bar is Accelerate itself on
a CPU machine: ``accelerate_suite_baseline.json`` lists the tests that pass under Accelerate
(re-measure with ``python -m tests.compat.suite --library accelerate --write-baseline``).

Every baseline test must pass under accel, except those in ``accelerate_suite_known.json``,
each with the cause it fails for today (regenerate with ``python -m tests.compat.suite
--library accel --write-known`` after fixing causes). A listed test that starts to pass fails
this test too, so the list only shrinks and stays true.
"""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path

import pytest

pytest.importorskip("accelerate", reason="the suite's helpers come from the accelerate wheel: "
                    "install the test extra (pip install -e '.[test]')")

from tests.compat.suite import BASELINE, KNOWN, run_suite  # noqa: E402

pytestmark = pytest.mark.slow


def _passed(results: dict[str, str]) -> set[str]:
    return {name for name, outcome in results.items() if outcome == "passed"}


def test_accelerate_suite_passes_under_accel_but_for_the_known_causes() -> None:
    baseline = set(json.loads(BASELINE.read_text())["passed"])
    known: dict[str, str] = json.loads(KNOWN.read_text())
    results = run_suite(library="accel", timeout=300)
    passed = _passed(results)
    print(f"Accelerate's suite under accel: {len(baseline & passed)} of the {len(baseline)} "
          f"tests that pass under Accelerate ({len(known)} known failures)")
    broken = {name: results.get(name, "not run: its file crashed or timed out")
              for name in sorted(baseline - passed - set(known))}
    assert not broken, ("these tests of Accelerate's suite passed before and fail now under "
                        f"accel:\n{json.dumps(broken, indent=1)}")
    fixed = sorted(set(known) & passed)
    assert not fixed, ("these now pass: delete them from "
                       f"{Path(KNOWN).name} (python -m tests.compat.suite --write-known):\n"
                       + "\n".join(fixed))
    stale = sorted(set(known) - baseline)
    assert not stale, f"not in the baseline (Accelerate does not pass them): {stale}"


def test_readme_states_the_suite_figures() -> None:
    baseline = json.loads(BASELINE.read_text())["passed"]
    known = json.loads(KNOWN.read_text())
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    figures = f"Of the {len(baseline)} tests that pass\nunder Accelerate itself on a CPU machine, " \
              f"{len(baseline) - len(known)} pass under accel"
    assert " ".join(figures.split()) in " ".join(readme.split()), (
        f"README's figures for Accelerate's suite are stale: write {figures!r}")


def _what_differs_rows(readme: str) -> set[str]:
    """First cells of the rows of the "What differs" table under "From Hugging Face Accelerate"."""
    section = readme.split("### From Hugging Face Accelerate", 1)[1].split("\n### ", 1)[0]
    table = section.split("What differs:", 1)[1].strip().split("\n\n", 1)[0]
    return {line.split("|")[1].strip() for line in table.splitlines()[2:]}


def test_every_known_failure_is_a_documented_departure() -> None:
    from tests.compat.departures import DEPARTURES, reasons

    known: dict[str, str] = json.loads(KNOWN.read_text())
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    rows = _what_differs_rows(readme)
    unexplained = {name: reasons(name) for name in known if len(reasons(name)) != 1}
    assert not unexplained, ("each known failure needs exactly one reason in "
                             f"tests/compat/departures.py: {unexplained}")
    missing = sorted(set(DEPARTURES.values()) - rows)
    assert not missing, f"README's 'What differs' table has no row for {missing}"
    unused = [pattern for pattern in DEPARTURES
              if not any(reasons(name) and fnmatch.fnmatchcase(name, pattern) for name in known)]
    assert not unused, f"these departures explain no known failure any more: {unused}"
