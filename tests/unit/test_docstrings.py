"""Every ``Example:`` in accel's docstrings runs and prints what it says (DESIGN.md §3.7).

Modules that need hardware or packages this machine may lack (torch_xla, a GPU) keep examples
that do not touch them; a module whose import needs a missing optional package is skipped with
the reason.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import accel

MODULES = sorted(m.name for m in pkgutil.walk_packages(accel.__path__, "accel."))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:  # an optional extra (the error names it)
        pytest.skip(f"{name} needs an optional package: {exc}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, report=True, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed"
