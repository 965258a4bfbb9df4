"""README.md's table of Accelerate names is what the code says (tests/compat/migration_table.py
generates it from the installed Accelerate and from accel), and what it claims holds."""

from __future__ import annotations

import inspect

import pytest

pytest.importorskip("accelerate", reason="the table lists Accelerate's names: install the test "
                    "extra (pip install -e '.[test]')")

from accel import Accelerator
from accel.compat.refusals import UNSUPPORTED_ARGUMENTS
from tests.compat import migration_table


def test_readme_holds_the_generated_table() -> None:
    text = migration_table.README.read_text()
    assert migration_table.readme_block(text) == migration_table.render(), (
        "README.md's Accelerate name table is stale: run "
        "`python -m tests.compat.migration_table --write`")


def test_every_accelerate_name_is_accepted_or_has_a_reason() -> None:
    unexplained = []
    for title, names, owner in migration_table.namespaces():
        for name in names:
            try:
                migration_table.classify([name], owner)
            except KeyError:
                unexplained.append(f"{title}: {name}")
    assert not unexplained, "Accelerate names accel neither has nor explains (add them, or a " \
        f"reason in accel/compat/refusals.py REFUSED): {unexplained}"


@pytest.mark.parametrize("name", sorted(UNSUPPORTED_ARGUMENTS))
def test_refused_arguments_raise_the_reason_in_the_table(name: str) -> None:
    assert name not in inspect.signature(Accelerator).parameters, \
        f"{name} is both accepted and listed as unsupported"
    with pytest.raises(TypeError, match="unsupported argument") as err:
        Accelerator(cpu=True, **{name: object()})
    assert UNSUPPORTED_ARGUMENTS[name] in str(err.value)
