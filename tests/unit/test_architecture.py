"""The layering of DESIGN.md §2, checked on the source with ``ast``.

Layer map (folders are layers; a module imports only from its own layer or below; no cycles)::

    L0    _base/  config/                          optional imports, validators, settings
    L1    env/  device/                            launcher detection, ACCEL_* settings, devices
    L2    distributed/ (+ health/)                 process group, collectives, probes
    L3    precision/  strategy/  data/  tracking/  the axes
    L4    run/  checkpoint/                        connector, run state, prepare, step; saves
    L5    accelerator/  compat/                    the facade; the Accelerate boundary
    L6    horovod/  ps/  big_modeling/             other front doors onto L2-L4
    side  launch/                                  env and config only; torch lazily
    shim  accel/*.py  utils/  tracking/__init__  accelerator/__init__   Accelerate's paths
    api   accel/__init__.py                        the lazy public facade

Rules checked here:

- every module has a layer, and every pattern of the table matches a module (no stale rows);
- no module imports a higher layer, counting lazy (in-function) and ``TYPE_CHECKING`` imports:
  a dependency is a dependency;
- Accelerate's module paths (the shims) are lazy re-exports of at most 40 lines, and the
  compatibility package ``accel/compat`` is imported only by the shims and ``accel/__init__``;
- no module imports the package root ``accel`` (the version lives in ``accel._version``);
- no import cycle among accel's modules (all imports count);
- a few seams stricter than layers: checkpoint storage knows no collectives and no protocol;
  the checkpoint protocol knows no preparation/precision/strategy/wrappers; the Accelerate
  checkpoint converter knows no collectives, protocol or launcher; env never imports torch;
- ``accel/launch/`` imports only L0/L1 modules and itself (at any level), and never torch at
  module level, so ``accel --help`` stays fast; the one exception is ``LAUNCH_LAZY_USES``
  (``accel convert-checkpoint`` and ``accel merge-weights`` lazily import their cores, L4;
  ``accel estimate-memory`` its estimator, L6; the torchrun launcher reads the agent's restart
  record through accel.distributed.health.elastic once torch is imported);
- only ``accel/env/_base.py`` touches the process environment (everything else asks accel/env);
- no backend branch (``isinstance(..., DistributedDataParallel)``, ``x.type == "cuda"``)
  outside ``device/`` and ``strategy/``;
- modules stay small (never over 600 lines) and functions at most 60 lines (DESIGN.md §3.1);
- every public name resolves (that ``import accel`` does not import torch is checked in a fresh
  interpreter by tests/e2e/test_architecture_imports.py).

The checkers are plain functions over {module name: (path, source)} so that the failure modes
are tested too, on small synthetic packages (see the ``test_checker_*`` tests).
"""

from __future__ import annotations

import ast
import fnmatch
import importlib
import textwrap
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "accel"

#: (path pattern relative to the repository root, layer). First match wins. Folders are layers:
#: every row but the public API, the CLI entry and the shims names a whole folder.
LAYER_TABLE: list[tuple[str, str]] = [
    ("accel/__init__.py", "api"),  # the lazy public facade
    ("accel/__main__.py", "side"),  # `python -m accel` = the CLI
    ("accel/launch/*", "side"),
    ("accel/_base/*", "L0"),
    ("accel/config/*", "L0"),
    ("accel/env/*", "L1"),
    ("accel/device/*", "L1"),
    ("accel/distributed/*", "L2"),  # with health/: the probes of torch and OS internals
    ("accel/precision/*", "L3"),
    ("accel/strategy/*", "L3"),
    ("accel/data/*", "L3"),
    ("accel/tracking/__init__.py", "shim"),  # Accelerate's accelerate.tracking path
    ("accel/tracking/*", "L3"),
    ("accel/run/*", "L4"),
    ("accel/checkpoint/*", "L4"),
    ("accel/accelerator/__init__.py", "shim"),  # Accelerate's accelerate.accelerator path
    ("accel/accelerator/*", "L5"),
    ("accel/compat/*", "L5"),
    ("accel/horovod/*", "L6"),
    ("accel/ps/*", "L6"),
    ("accel/big_modeling/*", "L6"),
    ("accel/utils/*", "shim"),  # Accelerate's accelerate.utils paths
    ("accel/commands/*", "shim"),  # Accelerate's accelerate.commands paths
    ("accel/*.py", "shim"),  # Accelerate's other module paths (state, data_loader, ...)
]
ORDER: dict[str, int] = {"L0": 0, "L1": 1, "L2": 2, "L3": 3, "L4": 4, "L5": 5, "L6": 6,
                         "shim": 7, "api": 7}
#: The only library modules that may use launch/ (the side layer), each naming the launch
#: modules it may import, and only lazily (inside a function). ``accel.utils.write_basic_config``
#: is Accelerate's in-library twin of ``accel config default``: it calls the same default-config
#: builder and writer rather than keeping a second copy. launch/ itself imports only L0/L1
#: (checked below), so this edge can create neither a cycle nor an upward dependency, and being
#: lazy it keeps the CLI off every library import path.
SIDE_USERS: dict[str, tuple[str, ...]] = {
    "accel/compat/other.py": ("accel.launch.config_cmd", "accel.launch.config_file"),
    # accelerate.commands.{launch,test,env}: Accelerate's in-library entry points of its CLI,
    # answered by accel's (the same parser and launcher as `accel launch`, no second copy)
    "accel/compat/commands.py": ("accel.launch.cli", "accel.launch.selftest",
                                 "accel.launch.info"),
    # accelerate.commands.config.config_args / to_fsdp2 / tpu / estimate and
    # accelerate.utils.launch: read and write config files with accel's reader and writer, and
    # answer launch questions with accel launch's own resolution, worker command and environment
    "accel/compat/commands_config.py": ("accel.launch.config_file",),
    "accel/compat/commands_tools.py": ("accel.launch.config_file", "accel.launch.cli"),
    "accel/compat/commands_launch.py": ("accel.launch.cli", "accel.launch.torchrun",
                                        "accel.launch.mpirun", "accel.launch.errors"),
}
#: Layers accel/launch may import from (at any level; module level adds "never torch").
LAUNCH_MAY_USE = {"L0", "L1", "side"}
#: The only library modules above L1 that launch/ may use, each for the launch module named,
#: and only lazily (inside the function that runs the command, after the arguments are parsed):
#: ``accel convert-checkpoint`` and ``accel merge-weights`` are commands over the checkpoint
#: storage (L4), which needs torch; ``accel estimate-memory`` builds a model on the meta device
#: (accel.big_modeling.estimate, L6); ``accel launch`` reads torchelastic's restart record and
#: the failed attempt's frames through accel.distributed.health.elastic (L2), because the probes
#: of torch internals live together in health/, each pinned by test_pins.py against the installed
#: torch (it runs torchelastic's agent, which imports torch anyway). None of them imports
#: launch/ (no cycle), and being lazy the edges keep ``accel --help`` and every other command
#: off torch.
LAUNCH_LAZY_USES: dict[str, tuple[str, ...]] = {
    "accel/launch/cli.py": ("accel.checkpoint.convert.command",
                            "accel.checkpoint.sharded.command",
                            "accel.big_modeling.estimate"),
    "accel/launch/torchrun.py": ("accel.distributed.health.elastic",),
}
#: Seams stricter than the layers: (importer pattern, forbidden target prefixes, why).
FORBIDDEN: list[tuple[str, tuple[str, ...], str]] = [
    ("accel/checkpoint/storage/*",
     ("accel.distributed", "torch.distributed", "accel.checkpoint.protocol"),
     "checkpoint storage writes and reads directories; it knows no collectives and no protocol"),
    ("accel/checkpoint/protocol/*",
     ("accel.run.prepare", "accel.precision", "accel.strategy", "accel.run.wrappers",
      "accel.run.accumulation", "accel.run.step", "accel.run.connector", "accel.accelerator"),
     "the checkpoint protocol depends only on a run-state snapshot and the communicator"),
    ("accel/checkpoint/sharded/*",
     ("accel.distributed", "accel.checkpoint.protocol", "accel.launch", "accel.run.prepare",
      "accel.precision", "accel.strategy", "accel.run.wrappers", "accel.run.connector"),
     "sharded state goes through torch's DCP over the checkpoint storage; it knows no accel "
     "collectives, no run protocol and no strategy, so merge-weights runs without a process "
     "group"),
    ("accel/env*", ("torch",), "env must stay importable without torch (accel --help)"),
    ("accel/checkpoint/convert/*",
     ("accel.distributed", "torch.distributed", "accel.checkpoint.protocol", "accel.launch"),
     "the converter writes with the checkpoint storage in one process; it knows no collectives, "
     "no protocol and no command line"),
]
#: The only module that may read or write the process environment (through it, accel/env).
ENV_READERS = ("accel/env/_base.py",)
ENV_NAMES = {"environ", "environb", "getenv", "putenv", "unsetenv"}
#: Where backend-specific branches belong.
BACKEND_HOMES = ("accel/device/*", "accel/strategy/*")

Sources = Mapping[str, tuple[str, str]]  # module name -> (path relative to root, source)


@dataclass(frozen=True)
class Import:
    target: str  # absolute module name, e.g. "accel.env" or "torch.distributed"
    line: int
    module_level: bool  # executed at import time (not inside a function)
    type_checking: bool  # inside `if TYPE_CHECKING:`


# ------------------------------------------------------------------ reading the package


def _module_name(rel: str) -> str:
    parts = list(Path(rel).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def read_package(root: Path, package: str = "accel") -> dict[str, tuple[str, str]]:
    """{module name: (path relative to ``root``, source)} for every module of ``package``."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(root).as_posix()
        out[_module_name(rel)] = (rel, path.read_text())
    return out


MODULES = read_package(ROOT)


def layer_of(rel: str, table: list[tuple[str, str]] = LAYER_TABLE) -> str | None:
    return next((layer for pattern, layer in table if fnmatch.fnmatch(rel, pattern)), None)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _resolve_from(name: str, rel: str, node: ast.ImportFrom, modules: Sources) -> list[str]:
    if node.level:
        package = name if rel.endswith("__init__.py") else name.rpartition(".")[0]
        parts = package.split(".")
        base = ".".join(parts[: len(parts) - (node.level - 1)])
        full = f"{base}.{node.module}" if node.module else base
    else:
        full = node.module or ""
    return [f"{full}.{alias.name}" if f"{full}.{alias.name}" in modules else full
            for alias in node.names]


def imports_of(name: str, modules: Sources) -> Iterator[Import]:
    """Every import in module ``name``: module level, in functions, under TYPE_CHECKING."""
    rel, source = modules[name]
    tree = ast.parse(source, filename=rel)

    def visit(node: ast.AST, in_function: bool, type_checking: bool) -> Iterator[Import]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(alias.name, node.lineno, not in_function, type_checking)
        elif isinstance(node, ast.ImportFrom):
            for target in _resolve_from(name, rel, node, modules):
                yield Import(target, node.lineno, not in_function, type_checking)
        for child in ast.iter_child_nodes(node):
            yield from visit(
                child,
                in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                 ast.Lambda)),
                type_checking or (isinstance(node, ast.If) and _is_type_checking(node)
                                  and child in node.body),
            )

    yield from visit(tree, False, False)


def _is_accel(target: str) -> bool:
    return target == "accel" or target.startswith("accel.")


def _is_torch(target: str) -> bool:
    return target == "torch" or target.startswith("torch.")


def _owner(target: str, modules: Sources) -> str | None:
    """The accel module that ``target`` names (its closest existing parent), or None."""
    while target:
        if target in modules:
            return target
        target = target.rpartition(".")[0]
    return None


# ------------------------------------------------------------------ checkers


def unlayered(modules: Sources, table: list[tuple[str, str]] = LAYER_TABLE) -> list[str]:
    return [rel for rel, _ in modules.values() if layer_of(rel, table) is None]


def stale_patterns(modules: Sources, table: list[tuple[str, str]] = LAYER_TABLE) -> list[str]:
    """Table rows that match no module, or only modules an earlier row already claimed."""
    rels = [rel for rel, _ in modules.values()]
    return [pattern for i, (pattern, _) in enumerate(table)
            if not any(fnmatch.fnmatch(rel, pattern) and layer_of(rel, table[:i]) is None
                       for rel in rels)]


def upward_imports(modules: Sources, table: list[tuple[str, str]] = LAYER_TABLE,
                   side_users: Mapping[str, tuple[str, ...]] = SIDE_USERS) -> list[str]:
    problems = []
    for name, (rel, _) in modules.items():
        layer = layer_of(rel, table)
        if layer is None:
            continue
        for imp in imports_of(name, modules):
            if not _is_accel(imp.target):
                continue
            if imp.target == "accel" and layer != "api":
                problems.append(f"{rel}:{imp.line} imports the package root `accel` (use "
                                "accel._base.version for the version, or the defining module)")
                continue
            owner = _owner(imp.target, modules)
            if owner is None or owner == name or layer == "side":
                continue  # launch/ has its own rule below
            target_layer = layer_of(modules[owner][0], table)
            if target_layer == "side" and layer != "api":
                if owner in side_users.get(rel, ()) and not imp.module_level:
                    continue
                problems.append(f"{rel}:{imp.line} ({layer}) imports the launcher module {owner}")
            elif target_layer in ORDER and layer in ORDER and \
                    ORDER[target_layer] > ORDER[layer]:
                problems.append(f"{rel}:{imp.line} ({layer}) imports {owner} ({target_layer})")
    return problems


def import_cycles(modules: Sources) -> list[list[str]]:
    """Strongly connected components (size > 1, or a self-loop) of the accel import graph."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name in modules:
        for imp in imports_of(name, modules):
            owner = _owner(imp.target, modules) if _is_accel(imp.target) else None
            if owner is not None and owner != name and owner != "accel":
                graph[name].add(owner)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                item = stack.pop()
                on_stack.discard(item)
                component.append(item)
                if item == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def forbidden_imports(modules: Sources) -> list[str]:
    problems = []
    for name, (rel, _) in modules.items():
        for pattern, targets, why in FORBIDDEN:
            if not fnmatch.fnmatch(rel, pattern):
                continue
            for imp in imports_of(name, modules):
                if any(imp.target == t or imp.target.startswith(t + ".") for t in targets):
                    problems.append(f"{rel}:{imp.line} imports {imp.target}: {why}")
    return problems


def launch_problems(modules: Sources, table: list[tuple[str, str]] = LAYER_TABLE,
                    lazy_uses: Mapping[str, tuple[str, ...]] = LAUNCH_LAZY_USES) -> list[str]:
    problems = []
    for name, (rel, _) in modules.items():
        if layer_of(rel, table) != "side":
            continue
        for imp in imports_of(name, modules):
            if imp.module_level and not imp.type_checking and _is_torch(imp.target):
                problems.append(f"{rel}:{imp.line} imports {imp.target} at module level")
            owner = _owner(imp.target, modules) if _is_accel(imp.target) else None
            if owner is None:
                continue
            target_layer = layer_of(modules[owner][0], table)
            if target_layer in LAUNCH_MAY_USE or \
                    owner in lazy_uses.get(rel, ()) and not imp.module_level:
                continue
            problems.append(f"{rel}:{imp.line} imports {owner} ({target_layer})")
    return problems


def environment_uses(source: str, label: str) -> Iterator[str]:
    tree = ast.parse(source, filename=label)
    os_names = {"os"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            os_names |= {a.asname or a.name for a in node.names if a.name == "os"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ENV_NAMES and \
                isinstance(node.value, ast.Name) and node.value.id in os_names:
            yield f"{label}:{node.lineno} uses {node.value.id}.{node.attr}"
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and \
                any(a.name in ENV_NAMES for a in node.names):
            yield f"{label}:{node.lineno} imports from os: " + \
                ", ".join(a.name for a in node.names if a.name in ENV_NAMES)


def environment_problems(modules: Sources) -> list[str]:
    return [use for rel, source in modules.values()
            if not any(fnmatch.fnmatch(rel, p) for p in ENV_READERS)
            for use in environment_uses(source, rel)]


def backend_branches(source: str, label: str) -> Iterator[str]:
    """``isinstance(x, ...DistributedDataParallel)`` and ``x.type ==/!=/in "literal"``."""
    for node in ast.walk(ast.parse(source, filename=label)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id == "isinstance" and len(node.args) == 2 and \
                "DistributedDataParallel" in ast.unparse(node.args[1]):
            yield f"{label}:{node.lineno} isinstance(..., DistributedDataParallel)"
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute) and \
                node.left.attr == "type" and any(
                    isinstance(c, ast.Constant) and isinstance(c.value, str)
                    or isinstance(c, (ast.Tuple, ast.Set, ast.List))
                    for c in node.comparators):
            yield f"{label}:{node.lineno} branches on {ast.unparse(node)}"


def backend_problems(modules: Sources) -> list[str]:
    return [hit for rel, source in modules.values()
            if not any(fnmatch.fnmatch(rel, p) for p in BACKEND_HOMES)
            for hit in backend_branches(source, rel)]


def size_problems(modules: Sources, max_module: int = 600, max_function: int = 60) -> list[str]:
    problems = []
    for rel, source in modules.values():
        lines = len(source.splitlines())
        if lines > max_module:
            problems.append(f"{rel}: {lines} lines (at most {max_module}; split it by job)")
        for node in ast.walk(ast.parse(source, filename=rel)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > max_function:
                    problems.append(f"{rel}:{node.lineno} {node.name}() is {length} lines "
                                    f"(at most {max_function})")
    return problems


def global_statements(modules: Sources) -> list[str]:
    """``global`` statements: module-level state rebound by functions (DESIGN.md §3.2: state
    lives in objects that are passed down; the few per-process holders are classes, named in
    their module's docstring)."""
    return [f"{rel}:{node.lineno} global {', '.join(node.names)}"
            for rel, source in modules.values()
            for node in ast.walk(ast.parse(source, filename=rel)) if isinstance(node, ast.Global)]


SHIM_MAX_LINES = 40
#: What a shim may hold: a docstring, imports, ``__all__``, ``__getattr__``/``__dir__`` (lazy
#: resolution) and a ``TYPE_CHECKING`` block of imports.
_SHIM_FUNCTIONS = {"__getattr__", "__dir__"}


def shim_problems(modules: Sources, table: list[tuple[str, str]] = LAYER_TABLE) -> list[str]:
    """Shims must be short re-exports: no classes, no logic beyond lazy lookup."""
    problems = []
    for rel, source in modules.values():
        if layer_of(rel, table) != "shim":
            continue
        lines = len(source.splitlines())
        if lines > SHIM_MAX_LINES:
            problems.append(f"{rel}: {lines} lines (a shim re-exports in at most "
                            f"{SHIM_MAX_LINES}; move code into the layer folders)")
        for node in ast.parse(source, filename=rel).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)) or \
                    isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue
            if isinstance(node, ast.FunctionDef) and node.name in _SHIM_FUNCTIONS and \
                    isinstance(node.body[-1], ast.Return) and all(
                        isinstance(n, (ast.Import, ast.ImportFrom)) for n in node.body[:-1]):
                continue  # lazy lookup: imports (of accel.compat, on first use) and a return
            if isinstance(node, ast.If) and _is_type_checking(node) and all(
                    isinstance(n, (ast.Import, ast.ImportFrom)) for n in node.body):
                continue
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and \
                    "__all__" in ast.unparse(node).split("=")[0]:
                continue
            problems.append(f"{rel}:{node.lineno} holds code ({type(node).__name__}); a shim "
                            "only re-exports")
    return problems


def compat_users(modules: Sources, table: list[tuple[str, str]] = LAYER_TABLE) -> list[str]:
    """Imports of accel/compat from anywhere but the shims, the API and compat itself; shims
    import it only lazily (inside ``__getattr__``/``__dir__``), so that importing an engine
    module of a shim package (``accel.tracking.trackers``) runs no compatibility code."""
    problems = []
    for name, (rel, _) in modules.items():
        layer = layer_of(rel, table)
        if layer == "api" or rel.startswith("accel/compat/"):
            continue
        for imp in imports_of(name, modules):
            if layer == "shim" and (not imp.module_level or imp.type_checking):
                continue
            if imp.target == "accel.compat" or imp.target.startswith("accel.compat."):
                problems.append(f"{rel}:{imp.line} imports {imp.target}")
    return problems


# ------------------------------------------------------------------ the package obeys


def test_every_module_has_a_layer() -> None:
    missing = unlayered(MODULES)
    assert not missing, (
        f"these modules have no layer: {missing}. Add each to LAYER_TABLE in "
        "tests/unit/test_architecture.py with its layer from the map in this file's docstring "
        "(shared/DESIGN.md §2) and a comment saying why")


def test_no_stale_layer_patterns() -> None:
    stale = stale_patterns(MODULES)
    assert not stale, f"LAYER_TABLE rows that match no module (remove them): {stale}"


def test_no_module_imports_a_higher_layer() -> None:
    problems = upward_imports(MODULES)
    assert not problems, (
        "a lower layer imports a higher one (DESIGN.md §2); move the shared code down a layer "
        "or pass the object in:\n" + "\n".join(problems))


def test_no_import_cycles() -> None:
    cycles = import_cycles(MODULES)
    assert not cycles, (
        "these modules import each other (directly or through others); move the shared code "
        "into a module both can import:\n" + "\n".join(" <-> ".join(c) for c in cycles))


def test_seams_stricter_than_layers() -> None:
    problems = forbidden_imports(MODULES)
    assert not problems, "\n".join(problems)


def test_launch_imports_only_env_and_config_and_never_torch_at_module_level() -> None:
    problems = launch_problems(MODULES)
    assert not problems, (
        "accel/launch may import only L0/L1 modules (config, env, _parse, _optional, logging, "
        "device) and itself, and never torch at module level (so `accel --help` does not "
        "import torch); import torch inside the function that needs it:\n"
        + "\n".join(problems))


def test_shims_only_re_export() -> None:
    problems = shim_problems(MODULES)
    assert not problems, (
        "Accelerate's module paths are thin lazy shims (DESIGN.md §2); put the code in a layer "
        "folder and list its names in accel/compat/paths.py:\n" + "\n".join(problems))


def test_only_shims_and_the_api_import_compat() -> None:
    problems = compat_users(MODULES)
    assert not problems, (
        "accel/compat is the Accelerate boundary: only the shims and accel/__init__ import it; "
        "the engine must not know Accelerate's names (derive them in compat instead):\n"
        + "\n".join(problems))


def test_checker_catches_fat_shims_and_engine_imports_of_compat() -> None:
    modules = _synthetic({
        "accel/__init__.py": "from .compat import x\n",
        "accel/state.py": "from .compat import paths\nclass State: pass\n",
        "accel/data_loader.py": "def __getattr__(n):\n    from .compat.paths import resolve\n"
                                "    return resolve(n)\n",
        "accel/hooks.py": '"""doc"""\nfrom typing import TYPE_CHECKING\n'
                          "def __getattr__(n):\n    return n\n"
                          "if TYPE_CHECKING:\n    from .compat.h import *\n",
        "accel/low.py": "def f():\n    from .compat import y\n",
        "accel/compat/__init__.py": "", "accel/compat/x.py": "from . import y\n",
        "accel/compat/y.py": "",
    })
    table = [("accel/__init__.py", "api"), ("accel/compat/*", "L5"), ("accel/low.py", "L0"),
             ("accel/*.py", "shim")]
    assert shim_problems(modules, table) == [
        "accel/state.py:2 holds code (ClassDef); a shim only re-exports"]
    assert compat_users(modules, table) == ["accel/state.py:1 imports accel.compat",
                                            "accel/low.py:2 imports accel.compat.y"]


def test_only_env_touches_the_environment() -> None:
    problems = environment_problems(MODULES)
    assert not problems, (
        "only accel/env reads or writes the environment; add a small typed function to "
        "accel/env and call it instead:\n" + "\n".join(problems))


def test_no_backend_branches_outside_device_and_strategy() -> None:
    problems = backend_problems(MODULES)
    assert not problems, (
        "backend differences belong to accel/device (the Device interface) or accel/strategy "
        "(the Strategy interface); add a method there instead of branching:\n"
        + "\n".join(problems))


def test_accelerator_init_only_connects() -> None:
    """Issue 13: ``Accelerator.__init__`` calls the connector and wires; it stays under 40 lines."""
    rel, source = MODULES["accel.accelerator.facade"]
    init = next(node for node in ast.walk(ast.parse(source, filename=rel))
                if isinstance(node, ast.FunctionDef) and node.name == "__init__")
    length = (init.end_lineno or init.lineno) - init.lineno + 1
    assert length < 40, f"Accelerator.__init__ is {length} lines; resolve in accel/connector.py"
    calls = {ast.unparse(n.func) for n in ast.walk(init) if isinstance(n, ast.Call)}
    assert "connect" in calls, "Accelerator.__init__ must build its runtime with connect()"


def test_modules_and_functions_are_small() -> None:
    problems = size_problems(MODULES)
    assert not problems, "DESIGN.md §3.1 sizes:\n" + "\n".join(problems)


def test_no_module_level_state_rebound_with_global() -> None:
    problems = global_statements(MODULES)
    assert not problems, (
        "DESIGN.md §3.2, no global state: keep it in an object the caller owns and passes "
        "down (a pool per call, the Accelerator's runtime), not in a module variable:\n"
        + "\n".join(problems))


# ------------------------------------------------------------------ the checkers catch


def _synthetic(files: dict[str, str]) -> dict[str, tuple[str, str]]:
    return {_module_name(rel): (rel, textwrap.dedent(src)) for rel, src in files.items()}


_TABLE = [("accel/__init__.py", "api"), ("accel/low.py", "L0"), ("accel/mid/*", "L2"),
          ("accel/high.py", "L5"), ("accel/launch/*", "side"), ("accel/gone/*", "L3")]


def test_checker_catches_an_upward_import_also_lazy_and_type_checking() -> None:
    modules = _synthetic({
        "accel/__init__.py": "",
        "accel/low.py": """
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from .high import Thing
            def f():
                from accel.mid import helper
        """,
        "accel/mid/__init__.py": "from .. import __version__\n",
        "accel/high.py": "from .low import x\nfrom .mid import y\n",
    })
    problems = upward_imports(modules, _TABLE)
    assert any("accel/low.py:4 (L0) imports accel.high (L5)" in p for p in problems), problems
    assert any("accel/low.py:6 (L0) imports accel.mid (L2)" in p for p in problems), problems
    assert any("accel/mid/__init__.py:1 imports the package root" in p for p in problems)
    assert not any(p.startswith("accel/high.py") for p in problems), problems


def test_checker_allows_only_listed_lazy_side_imports() -> None:
    modules = _synthetic({
        "accel/__init__.py": "from .launch import cli\n",
        "accel/high.py": "from .launch import cli\ndef f():\n    from .launch import cli\n"
                         "    from .launch import other\n",
        "accel/launch/__init__.py": "", "accel/launch/cli.py": "", "accel/launch/other.py": "",
    })
    allowed = {"accel/high.py": ("accel.launch.cli",)}
    assert upward_imports(modules, _TABLE, allowed) == [
        "accel/high.py:1 (L5) imports the launcher module accel.launch.cli",  # module level
        "accel/high.py:4 (L5) imports the launcher module accel.launch.other"]  # not listed
    assert len(upward_imports(modules, _TABLE, {})) == 3


def test_checker_catches_a_cycle_through_lazy_imports() -> None:
    modules = _synthetic({
        "accel/__init__.py": "",
        "accel/low.py": "def f():\n    from .mid.a import g\n",
        "accel/mid/__init__.py": "",
        "accel/mid/a.py": "from . import b\n",
        "accel/mid/b.py": "from ..low import f\n",
        "accel/high.py": "from .low import f\n",
    })
    assert import_cycles(modules) == [["accel.low", "accel.mid.a", "accel.mid.b"]]
    modules["accel.mid.b"] = ("accel/mid/b.py", "import json\n")
    assert import_cycles(modules) == []


def test_checker_catches_a_stray_environment_read_and_every_spelling() -> None:
    source = textwrap.dedent("""
        import os
        import os as _os
        from os import environ, getenv as ge
        a = os.environ["X"]; b = _os.getenv("Y"); os.putenv("Z", "1"); c = os.environ.get("W")
        d = os.path.join("a", "b"); e = os.getpid()
    """)
    found = list(environment_uses(source, "probe.py"))
    assert len(found) == 5, found  # one `from os import` line, four attribute uses
    assert "probe.py:4 imports from os: environ, getenv" in found
    modules = _synthetic({"accel/high.py": "import os\nX = os.environ.get('A')\n",
                          "accel/env/_base.py": "import os\nY = os.environ\n"})
    assert environment_problems(modules) == ["accel/high.py:2 uses os.environ"]


def test_checker_catches_stale_rows_unlayered_modules_and_launch_imports() -> None:
    modules = _synthetic({
        "accel/__init__.py": "", "accel/low.py": "", "accel/mid/__init__.py": "",
        "accel/high.py": "", "accel/extra.py": "",
        "accel/launch/cli.py": "import torch\nfrom ..low import x\ndef f():\n"
                               "    from ..high import y\n    import torch.nn\n",
    })
    assert stale_patterns(modules, _TABLE) == ["accel/gone/*"]
    assert unlayered(modules, _TABLE) == ["accel/extra.py"]
    assert launch_problems(modules, _TABLE) == [
        "accel/launch/cli.py:1 imports torch at module level",
        "accel/launch/cli.py:4 imports accel.high (L5)"]


def test_checker_allows_only_listed_lazy_uses_by_launch() -> None:
    modules = _synthetic({
        "accel/__init__.py": "", "accel/high.py": "", "accel/low.py": "",
        "accel/launch/cli.py": "from ..high import z\ndef f():\n    from ..high import y\n",
        "accel/launch/other.py": "def f():\n    from ..high import y\n",
    })
    allowed = {"accel/launch/cli.py": ("accel.high",)}
    assert launch_problems(modules, _TABLE, allowed) == [
        "accel/launch/cli.py:1 imports accel.high (L5)",  # module level: never allowed
        "accel/launch/other.py:2 imports accel.high (L5)"]  # not listed for this module
    assert len(launch_problems(modules, _TABLE, {})) == 3


def test_checker_catches_backend_branches() -> None:
    source = textwrap.dedent("""
        from torch import nn
        if isinstance(m, nn.parallel.DistributedDataParallel): pass
        if device.type == "xla": pass
        if t.device.type in ("cuda", "xla"): pass
        if t.dtype in (a, b): pass
        if kind == "xla": pass
    """)
    found = list(backend_branches(source, "probe.py"))
    assert [f.split(" ")[0] for f in found] == ["probe.py:3", "probe.py:4", "probe.py:5"], found


def test_checker_catches_big_modules_and_long_functions() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    modules = _synthetic({"accel/big.py": f"def long():\n{body}\n" + "# pad\n" * 540,
                          "accel/ok.py": "def short():\n    return 1\n"})
    assert size_problems(modules) == ["accel/big.py: 601 lines (at most 600; split it by job)",
                                      "accel/big.py:1 long() is 61 lines (at most 60)"]


def test_checker_catches_global_statements() -> None:
    modules = _synthetic({"accel/pool.py": """
        _pool = None

        def shared():
            global _pool
            return _pool
        """, "accel/ok.py": "def f():\n    x = 1\n    return x\n"})
    assert global_statements(modules) == ["accel/pool.py:5 global _pool"]


# ------------------------------------------------------------------ public names


@pytest.mark.parametrize("name", importlib.import_module("accel").__all__)
def test_public_name_resolves(name: str) -> None:
    accel = importlib.import_module("accel")
    assert getattr(accel, name) is not None
    if name != "__version__":
        assert name in dir(accel)
