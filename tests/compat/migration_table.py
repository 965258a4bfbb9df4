"""The README's table of Hugging Face Accelerate names: which accel accepts, which it does not
and why. Generated from the installed ``accelerate`` (1.15.0, the test extra's pin) and accel's
own code; tests/compat/test_migration_table.py checks that README.md holds exactly this text.
The reasons are accel's own (``accel.compat.refusals``: the same text the refused names raise).

    python -m tests.compat.migration_table --write    # regenerate the block in README.md
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType

import accel
import accel.utils
from accel import Accelerator
from accel.compat.refusals import (
    LEGACY_ARGUMENTS,
    UNSUPPORTED_ARGUMENTS,
    is_stand_in,
    refused_reason,
)

README = Path(__file__).resolve().parents[2] / "README.md"
BEGIN, END = "<!-- accelerate-names -->", "<!-- /accelerate-names -->"


def _public(obj: object) -> list[str]:
    return sorted(n for n in dir(obj) if not n.startswith("_"))


def _path(owner: object) -> str:
    """The key of ``owner`` in ``accel.compat.refusals.REFUSED``."""
    return owner.__name__ if isinstance(owner, ModuleType) else "accel.Accelerator"


def _reason(name: str, path: str) -> str:
    reason = refused_reason(path, name)
    if reason is None:
        raise KeyError(f"{name}: accel neither provides it nor says why; add it to accel or give "
                       f"a reason in accel/compat/refusals.py REFUSED[{path!r}]")
    return reason


def _has(owner: object, name: str) -> bool:
    """``owner`` has ``name``, or (for a package) a submodule of that name can be imported."""
    if hasattr(owner, name):
        return not is_stand_in(getattr(owner, name))
    if isinstance(owner, ModuleType) and hasattr(owner, "__path__"):
        return importlib.util.find_spec(f"{owner.__name__}.{name}") is not None
    return False


def classify(names: list[str], has: object) -> tuple[list[str], dict[str, list[str]]]:
    """(names accel has, {reason: names it does not have})."""
    accepted: list[str] = []
    refused: dict[str, list[str]] = {}
    for name in names:
        if _has(has, name):
            accepted.append(name)
        else:
            refused.setdefault(_reason(name, _path(has)), []).append(name)
    return accepted, refused


def namespaces() -> list[tuple[str, list[str], object]]:
    """(title, Accelerate's names, what in accel should have them)."""
    import accelerate
    import accelerate.utils

    from_acc = accelerate.Accelerator
    top = [n for n in _public(accelerate)
           if not isinstance(getattr(accelerate, n), ModuleType) or _has(accel, n)
           or n in ("big_modeling", "hooks", "inference", "commands", "launchers",
                    "checkpointing", "data_loader", "optimizer", "scheduler", "logging", "state")]
    utils = [n for n in _public(accelerate.utils)
             if not isinstance(getattr(accelerate.utils, n), ModuleType)]
    return [("`accelerate` (top level)", top, accel),
            ("`Accelerator` attributes and methods", _public(from_acc), Accelerator),
            ("`accelerate.utils`", utils, accel.utils)]


def _codes(names: list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def render() -> str:
    import accelerate

    lines = [BEGIN, "", f"Generated from Accelerate {accelerate.__version__} and this accel "
             "(`python -m tests.compat.migration_table --write`; a test keeps it true).", ""]
    params = list(inspect.signature(__import__("accelerate").Accelerator).parameters)
    ours = inspect.signature(Accelerator).parameters
    accepted = [p for p in params
                if (p in ours or p in LEGACY_ARGUMENTS) and p not in UNSUPPORTED_ARGUMENTS]
    lines += [f"**`Accelerator(...)` arguments.** Accepted: {_codes(accepted)}. Refused with a "
              "`TypeError` that says what to do instead:", "", "| argument | what to do |",
              "|---|---|"]
    for name in params:
        if name not in accepted:
            lines.append(f"| `{name}` | {UNSUPPORTED_ARGUMENTS[name]} |")
    for title, names, has in namespaces():
        got, refused = classify(names, has)
        lines += ["", f"**{title}.** Accepted ({len(got)} of {len(names)}): {_codes(got)}.", ""]
        if refused:
            lines += ["| not provided | why |", "|---|---|"]
            lines += [f"| {_codes(ns)} | {reason} |" for reason, ns in refused.items()]
    lines += ["", END]
    return "\n".join(lines)


def readme_block(text: str) -> str:
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[start:end]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the README's Accelerate name table")
    parser.add_argument("--write", action="store_true", help="rewrite the block in README.md")
    args = parser.parse_args(argv)
    table = render()
    if args.write:
        text = README.read_text()
        README.write_text(text.replace(readme_block(text), table))
    else:
        sys.stdout.write(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
