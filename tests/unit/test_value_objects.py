"""Value objects are ``@dataclass(kw_only=True, slots=True)`` (DESIGN.md §2), checked with ``ast``.

Keyword-only construction keeps call sites readable and lets fields be added or reordered
without silently shifting positional arguments; slots catch a misspelt attribute assignment
(``obj.wrold_size = 2`` raises instead of adding a new attribute) and make the objects smaller.

The exceptions are listed below with their reason: the public configuration classes whose
Accelerate, Horovod or Paddle counterparts accept positional arguments (or that users subclass
and set attributes on) keep their construction semantics, and a class that must be weakly
referenced on Python 3.10 (``weakref_slot`` arrived in 3.11) is keyword-only without slots.
"""

from __future__ import annotations

import ast
import importlib
import textwrap
from collections.abc import Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "accel"

#: Public classes that keep their constructor as it is ("module:Class" -> why).
PUBLIC: dict[str, str] = {
    # Accelerate's configuration classes (exported by accel/__init__.py): Accelerate accepts
    # positional arguments, scripts subclass them and set attributes after construction.
    **dict.fromkeys((f"accel.config.settings:{name}" for name in (
        "AutocastKwargs", "DataLoaderConfiguration", "DistributedDataParallelKwargs",
        "GradScalerKwargs", "GradientAccumulationPlugin", "InitProcessGroupKwargs",
        "ProjectConfiguration")), "Accelerate configuration class"),
    "accel.config.fsdp:FullyShardedDataParallelPlugin": "Accelerate configuration class",
    # Accelerate's config-file classes (accelerate.commands.config.config_args): scripts
    # construct and subclass them as plain dataclasses
    **dict.fromkeys((f"accel.compat.commands_config:{name}" for name in (
        "BaseConfig", "ClusterConfig")), "Accelerate configuration class"),
    **dict.fromkeys((f"accel.config.parallelism:{name}" for name in (
        "ParallelismConfig", "TorchContextParallelConfig", "TorchTensorParallelConfig")),
        "Accelerate configuration class"),
    "accel.strategy.compile:TorchDynamoPlugin": "Accelerate configuration class",
    # accel.ps's sparse optimizers: Paddle's optimizers take the learning rate positionally.
    **dict.fromkeys((f"accel.ps.optimizers:{name}" for name in (
        "SparseOptimizer", "SGD", "Adagrad", "Adam")), "Paddle-style public optimizer"),
}
#: Keyword-only classes that cannot have slots ("module:Class" -> why).
NO_SLOTS: dict[str, str] = {
    "accel.horovod._session:Session": "hvd.SyncBatchNorm keeps a weakref to it; weakref_slot "
                                      "needs Python 3.11",
}


def _dataclass_options(decorator: ast.expr) -> dict[str, object] | None:
    """The keyword options of a ``@dataclass`` decorator ({} when bare), None if not one."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    name = target.attr if isinstance(target, ast.Attribute) else \
        target.id if isinstance(target, ast.Name) else None
    if name != "dataclass":
        return None
    if not isinstance(decorator, ast.Call):
        return {}
    return {k.arg: ast.literal_eval(k.value) for k in decorator.keywords if k.arg is not None}


def dataclasses_in(sources: Mapping[str, str]) -> dict[str, dict[str, object]]:
    """{"module:Class": its dataclass options} for every dataclass of ``sources``."""
    found: dict[str, dict[str, object]] = {}
    for module, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.ClassDef):
                continue
            for decorator in node.decorator_list:
                options = _dataclass_options(decorator)
                if options is not None:
                    found[f"{module}:{node.name}"] = options
    return found


def violations(sources: Mapping[str, str], public: Mapping[str, str],
               no_slots: Mapping[str, str]) -> list[str]:
    """Each dataclass that is not ``kw_only=True, slots=True`` and not excused, and each stale
    exception (a listed class that is not a dataclass of ``sources``)."""
    found = dataclasses_in(sources)
    problems = [f"{name}: listed as an exception but no such dataclass"
                for name in sorted({*public, *no_slots} - set(found))]
    for name, options in sorted(found.items()):
        if name in public:
            continue
        missing = [option for option in ("kw_only", "slots")
                   if options.get(option) is not True
                   and not (option == "slots" and name in no_slots)]
        if missing:
            problems.append(f"{name}: @dataclass needs {'=True, '.join(missing)}=True "
                            "(value objects are keyword-only and slotted; see DESIGN.md §2)")
    return problems


def _package_sources() -> dict[str, str]:
    sources = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        sources[module] = path.read_text(encoding="utf-8")
    return sources


def test_every_internal_dataclass_is_keyword_only_and_slotted() -> None:
    assert violations(_package_sources(), PUBLIC, NO_SLOTS) == []


def test_the_public_exceptions_are_public() -> None:
    """Every class excused as public is reachable from accel/__init__.py, accel.ps or one of
    Accelerate's module paths (accel.compat.paths)."""
    import accel
    import accel.ps
    from accel.compat.paths import PATHS, names

    reachable = {id(getattr(accel, name)) for name in accel.__all__ if name != "__version__"}
    reachable |= {id(getattr(accel.ps, name)) for name in accel.ps.__all__}
    for path in PATHS:
        module = importlib.import_module(path)
        reachable |= {id(getattr(module, name)) for name in names(path)}
    for name in PUBLIC:
        module, cls = name.split(":")
        obj = getattr(importlib.import_module(module), cls)
        assert id(obj) in reachable, f"{name} is excused as public but accel does not export it"


def test_checker_catches_positional_and_unslotted_dataclasses() -> None:
    source = textwrap.dedent("""
        import dataclasses
        from dataclasses import dataclass

        @dataclass
        class Bare:
            x: int

        @dataclass(frozen=True, kw_only=True)
        class NoSlots:
            x: int

        @dataclasses.dataclass(slots=True)
        class Positional:
            x: int

        @dataclass(frozen=True, kw_only=True, slots=True)
        class Good:
            x: int

        @dataclass
        class Excused:
            x: int

        @dataclass(kw_only=True)
        class Weak:
            x: int

        class NotADataclass:
            x: int
        """)
    problems = violations({"pkg.mod": source}, {"pkg.mod:Excused": "public"},
                          {"pkg.mod:Weak": "weakref", "pkg.mod:Gone": "stale"})
    assert problems == [
        "pkg.mod:Gone: listed as an exception but no such dataclass",
        "pkg.mod:Bare: @dataclass needs kw_only=True, slots=True (value objects are "
        "keyword-only and slotted; see DESIGN.md §2)",
        "pkg.mod:NoSlots: @dataclass needs slots=True (value objects are keyword-only and "
        "slotted; see DESIGN.md §2)",
        "pkg.mod:Positional: @dataclass needs kw_only=True (value objects are keyword-only and "
        "slotted; see DESIGN.md §2)",
    ]


@pytest.mark.parametrize("kind", ["positional", "unknown attribute"])
def test_value_objects_refuse_positional_arguments_and_unknown_attributes(kind: str) -> None:
    from accel.distributed import ProcessContext
    from accel.run.accumulation import AccumulationState

    if kind == "positional":
        with pytest.raises(TypeError, match="positional"):
            ProcessContext(0, 0, 1, 1, 0, "cpu", "gloo", "none")  # type: ignore[misc]
    else:
        state = AccumulationState()
        with pytest.raises(AttributeError):
            state.num_step = 2  # type: ignore[attr-defined]  # misspelt: slots refuse it
