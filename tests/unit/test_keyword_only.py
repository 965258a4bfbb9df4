"""Internal functions are keyword-only after the first argument (DESIGN.md §2), via ``ast``.

``save_run(comm, snap, None, None, path, None)`` cannot be read without the signature, and a
positional boolean (``apply(fn, tree, True)``) cannot be read even with it. So an *internal*
function (module-level function or method) that has a ``bool`` parameter (``bool | None``
included) or more than three parameters (not counting ``self``/``cls``) takes every parameter
after its first as keyword-only: ``save_run(comm, snapshot=..., output_dir=...)``.

Exempt, by rule (computed below from the live package, so a new public name is exempt without
editing this file):

(a) public API whose positional signature users rely on: every function reachable from
    ``accel/__init__.py``'s ``_EXPORTS``, from Accelerate's module paths (the target modules and
    extra names of :mod:`accel.compat.paths`) and from the ``__all__`` of the front doors
    ``accel.horovod`` (+ ``accel.horovod.elastic``), ``accel.ps`` and ``accel.big_modeling``
    (Horovod's, Paddle's and Accelerate's signatures); for each public class, its constructor
    and public methods, and those of every accel class it inherits from (the ``Accelerator``
    mixins, state views, trackers, data loaders, ``LocalSGD``);
(b) dunder methods other than ``__init__`` (the data model fixes their signatures), and methods
    that override a method of a class outside accel (``forward``, ``state_dict``,
    ``load_state_dict``, ``logging.LoggerAdapter.log``, ``argparse.Action.__call__``, the
    ``__init__`` of a torch or stdlib subclass, iterator protocol): the base class fixes them;
(c) the short list ``ALLOWED`` below, each entry with its reason.

Callbacks that a library calls positionally (torch hooks, signal handlers, ``atexit``) are closures
or short methods in accel, which the rules above already leave alone.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "accel"

#: Front doors whose ``__all__`` keeps another library's positional signatures.
FRONT_DOORS = ("accel.horovod", "accel.horovod.elastic", "accel.ps", "accel.big_modeling")

#: (c) Internal functions that keep positional parameters ("module:qualname" -> why).
ALLOWED: dict[str, str] = {
    "accel.launch.notebook:_worker": "the entry point torch's elastic_launch(config, fn)(*args) "
                                     "calls with positional arguments only",
}

_BOOL = {"bool", "bool | None", "None | bool", "Optional[bool]"}
_MAX_PARAMETERS = 3


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef,
                                                     bool]]:
    """(qualname, node, is_method) of each module-level function and method (not closures)."""
    def walk(body: Iterable[ast.stmt], prefix: str, in_class: bool
             ) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef, bool]]:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield prefix + node.name, node, in_class
            elif isinstance(node, ast.ClassDef):
                yield from walk(node.body, f"{prefix}{node.name}.", True)
            elif isinstance(node, (ast.If, ast.Try)):
                yield from walk([*node.body, *node.orelse], prefix, in_class)
    yield from walk(tree.body, "", False)


def _needs_keywords(node: ast.FunctionDef | ast.AsyncFunctionDef, is_method: bool) -> bool:
    """Whether ``node`` has a bool or > 3 parameters and more than one positional one."""
    args = node.args
    static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list)
    positional = [*args.posonlyargs, *args.args][1 if is_method and not static else 0:]
    parameters = [*positional, *args.kwonlyargs]
    has_bool = any(p.annotation is not None and ast.unparse(p.annotation) in _BOOL
                   for p in parameters)
    return (has_bool or len(parameters) > _MAX_PARAMETERS) and len(positional) > 1


def violations(sources: Mapping[str, str], exempt: Mapping[str, str],
               allowed: Mapping[str, str]) -> list[str]:
    """Each internal function of ``sources`` ({module: source}) that takes more than its first
    parameter positionally and is neither ``exempt`` nor ``allowed``, and each stale entry of
    ``allowed`` (no such function)."""
    problems = []
    seen = set()
    for module, source in sources.items():
        for qualname, node, is_method in _functions(ast.parse(source)):
            name = f"{module}:{qualname}"
            seen.add(name)
            dunder = node.name.startswith("__") and node.name.endswith("__")
            if name in exempt or name in allowed or (dunder and node.name != "__init__"):
                continue
            if _needs_keywords(node, is_method):
                problems.append(f"{name} (line {node.lineno}): make the parameters after the "
                                "first keyword-only (add `*`; see DESIGN.md §2)")
    problems += [f"{name}: allowed to stay positional but no such function"
                 for name in sorted(set(allowed) - seen)]
    return problems


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_sources() -> dict[str, str]:
    return {_module_name(p): p.read_text(encoding="utf-8") for p in sorted(PACKAGE.rglob("*.py"))}


def _key(obj: Any) -> str:
    obj = inspect.unwrap(obj)
    return f"{obj.__module__}:{obj.__qualname__}"


def _public_objects() -> Iterator[Any]:
    """(a): every object a user reaches by a public name."""
    import accel
    from accel.compat.paths import EXTRA, PATHS, SUBMODULES

    for name in accel._EXPORTS:
        yield getattr(accel, name)
    for path in PATHS:
        module = importlib.import_module(path)
        for name in [*module.__all__, *EXTRA.get(path, {})]:
            if name not in SUBMODULES.get(path, ()):
                yield getattr(module, name)
    for door in FRONT_DOORS:
        module = importlib.import_module(door)
        yield from (getattr(module, name) for name in module.__all__)


def _in_accel(obj: Any) -> bool:
    return str(getattr(obj, "__module__", "")).startswith("accel")


def _public_exemptions() -> dict[str, str]:
    exempt: dict[str, str] = {}
    for obj in _public_objects():
        if inspect.isclass(obj):
            for cls in filter(_in_accel, obj.__mro__):
                for name, member in vars(cls).items():
                    member = getattr(member, "__func__", member)  # static/class methods
                    if inspect.isfunction(member) and (not name.startswith("_")
                                                       or name == "__init__"):
                        exempt[_key(member)] = f"public method of {obj.__qualname__}"
        elif inspect.isfunction(inspect.unwrap(obj)) and _in_accel(inspect.unwrap(obj)):
            exempt[_key(obj)] = "public function"
    return exempt


def _override_exemptions(modules: Iterable[str]) -> dict[str, str]:
    """(b): methods of accel classes that a base class outside accel also defines."""
    exempt: dict[str, str] = {}
    for module_name in modules:
        module = importlib.import_module(module_name)
        for cls in vars(module).values():
            if not inspect.isclass(cls) or cls.__module__ != module_name:
                continue
            outside = [base for base in cls.__mro__[1:] if not _in_accel(base)]
            for name, member in vars(cls).items():
                member = getattr(member, "__func__", member)
                if inspect.isfunction(member) and any(name in vars(b) for b in outside):
                    exempt[_key(member)] = "overrides " + next(
                        b.__qualname__ for b in outside if name in vars(b))
    return exempt


def test_internal_functions_are_keyword_only_after_the_first_argument() -> None:
    sources = _package_sources()
    exempt = {**_public_exemptions(), **_override_exemptions(sources)}
    assert violations(sources, exempt, ALLOWED) == []


def test_checker_catches_positional_parameters_and_accepts_the_exemptions() -> None:
    source = textwrap.dedent("""
        def flag(x, verbose: bool): ...
        def many(a, b, c, d): ...
        def optional_flag(x, strict: bool | None = None): ...
        class C:
            def __init__(self, a, b, c, d): ...
            def method(self, x, fast: bool = False): ...
            @staticmethod
            def static(a, b, c, d): ...
            def __call__(self, a, b, c, d): ...
            def good(self, x, *, fast: bool = False): ...
            def public(self, a, b, c, d): ...
        def few(a, b, c): ...
        def keyword_only(a, *, b, c, d, flag: bool): ...
        def allowed(a, b, c, d): ...
        def outer():
            def closure(a, b, c, d): ...
        """)
    problems = violations({"pkg.mod": source}, {"pkg.mod:C.public": "public"},
                          {"pkg.mod:allowed": "reason", "pkg.mod:gone": "stale"})
    assert [p.split(" (")[0] for p in problems] == [
        "pkg.mod:flag", "pkg.mod:many", "pkg.mod:optional_flag", "pkg.mod:C.__init__",
        "pkg.mod:C.method", "pkg.mod:C.static",
        "pkg.mod:gone: allowed to stay positional but no such function"]
    assert problems[0].endswith("make the parameters after the first keyword-only (add `*`; "
                                "see DESIGN.md §2)")


def test_the_exemption_rules_see_public_api_and_overrides() -> None:
    """The derived exemptions contain what the rules promise (so a broken rule fails here)."""
    public = _public_exemptions()
    assert "accel.accelerator.facade:Accelerator.unwrap_model" in public  # facade method
    assert "accel.accelerator.checkpoints:CheckpointingMixin.save_state" in public  # mixin
    assert "accel.horovod.ops:allreduce" in public  # Horovod's allreduce(tensor, average, name)
    assert "accel.compat.data_loader:prepare_data_loader" in public  # Accelerate path
    overrides = _override_exemptions(["accel.env.log", "accel.distributed.batchnorm"])
    assert "accel.env.log:MultiProcessAdapter.log" in overrides  # logging.LoggerAdapter.log
    assert "accel.distributed.batchnorm:_GroupBatchNorm.forward" in overrides  # Function.forward
