"""Hugging Face Accelerate's own pytest suite, ported to accel by swapping its imports only.

Source: the top-level ``tests/*.py`` of the accelerate 1.15.0 source distribution on PyPI,
pinned by its sha256 and fetched once with pip into a cache (``$ACCEL_COMPAT_CACHE``, default
``~/.cache/accel-compat``). None of Accelerate's code is stored in this repository.

The port (:func:`port_source`) changes import statements only:

- ``accelerate.test_utils[.*]`` -> :mod:`tests.compat.suite_utils` (Accelerate's helpers, with
  the state-reading ones answered for accel);
- ``from accelerate[.x] import ...`` -> ``from accel[.x] import ...``;
- ``import accelerate[.x]`` -> ``import accel[.x]`` bound to the name the test uses.

Other edits: none. Strings that name Accelerate's modules (``mock.patch("accelerate...")``)
stay as they are, so such a test exercises Accelerate's module, not accel's, and fails or passes
on its own terms; the known-failures table says so where it matters.

Each test file runs in its own pytest process (a crash or hang costs one file), with a per-file
timeout. Run by hand to compare the two libraries::

    python -m tests.compat.suite --library accel
    python -m tests.compat.suite --library accelerate --write-baseline
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

__all__ = ["BASELINE", "KNOWN", "SHA256", "VERSION", "port_file", "port_source", "run_suite",
           "source_dir", "suite_files"]

VERSION = "1.15.0"
SHA256 = "5654f8c5eaa0d4fa68b33e287a97765da6849bf6d51dcac874e73fbbddfb6134"
ROOT = Path(__file__).resolve().parents[2]
#: The tests that pass under Accelerate itself on a CPU machine (``--write-baseline``).
BASELINE = Path(__file__).with_name("accelerate_suite_baseline.json")
#: Baseline tests that do not pass under accel yet, each with its failure (``--write-known``).
KNOWN = Path(__file__).with_name("accelerate_suite_known.json")
_CACHE = Path(os.environ.get("ACCEL_COMPAT_CACHE", Path.home() / ".cache" / "accel-compat"))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_sdist(package: str, *, version: str, sha256: str, keep: Callable[[str], bool],
                ready: str) -> Path:
    """``<cache>/<package>-<version>``: the members of the pinned sdist that ``keep`` accepts
    (paths relative to the sdist's top folder), fetched by pip and verified on first use;
    ``ready`` is a member whose presence means an earlier call already did it.

    Raises:
        RuntimeError: pip could not fetch it, or its sha256 is not the pinned one.
    """
    dest = _CACHE / f"{package}-{version}"
    if (dest / ready).exists():
        return dest
    _CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=_CACHE) as tmp:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
             f"{package}=={version}", "-d", tmp], capture_output=True, text=True, timeout=300)
        sdist = Path(tmp) / f"{package}-{version}.tar.gz"
        if done.returncode != 0 or not sdist.is_file():
            raise RuntimeError(f"could not fetch the {package} {version} sdist from the package "
                               f"index (pip download exited {done.returncode}): "
                               f"{done.stderr[-400:]}; set ACCEL_COMPAT_CACHE to a directory "
                               f"that holds {package}-{version}/{ready}")
        if _sha256(sdist) != sha256:
            raise RuntimeError(f"{sdist.name} has sha256 {_sha256(sdist)}, not the pinned "
                               f"{sha256}: refusing to run it")
        staged = Path(tmp) / "unpacked"
        top = f"{package}-{version}/"
        with tarfile.open(sdist) as archive:
            members = [m for m in archive.getmembers() if m.isfile()
                       and m.name.startswith(top) and keep(m.name[len(top):])]
            archive.extractall(staged, members=members, filter="data")
        (staged / f"{package}-{version}").rename(dest)
    return dest


def source_dir() -> Path:
    """The unpacked accelerate sdist (its ``tests/*.py`` and ``LICENSE``)."""
    return fetch_sdist("accelerate", version=VERSION, sha256=SHA256, ready="tests",
                       keep=lambda name: name == "LICENSE"
                       or re.fullmatch(r"tests/[^/]+\.py", name) is not None)


_FROM = re.compile(r"^(\s*)from accelerate((?:\.\w+)*) import ")
_IMPORT = re.compile(r"^(\s*)import accelerate((?:\.\w+)*)(\s+as\s+\w+)?\s*$")


def port_source(source: str) -> str:
    """``source`` with its Accelerate imports swapped to accel (see the module docstring).

    Example:
        >>> print(port_source("from accelerate.utils import gather\\nimport accelerate\\n"
        ...                   "from accelerate.test_utils.testing import slow"), end="")
        from accel.utils import gather
        import accel as accelerate
        from tests.compat.suite_utils import slow
    """
    out = []
    for line in source.splitlines():
        if match := _FROM.match(line):
            indent, module = match.group(1), match.group(2)
            target = "tests.compat.suite_utils" if re.match(r"\.test_utils\b", module) \
                else "accel" + module
            line = f"{indent}from {target} import " + line[match.end():]
        elif match := _IMPORT.match(line):
            indent, module, alias = match.group(1), match.group(2), match.group(3)
            if module.startswith(".test_utils"):
                module = "tests.compat.suite_utils"
                line = f"{indent}import {module}{alias or ' as test_utils'}"
            elif alias or not module:
                line = f"{indent}import accel{module}{alias or ' as accelerate'}"
            else:  # `import accelerate.commands.test` binds `accelerate`
                line = f"{indent}import accel{module}; import accel as accelerate"
        out.append(line)
    return "\n".join(out) + "\n"


def port_file(path: Path) -> Path:
    """A ported copy of one of Accelerate's files (kept in the cache, by content)."""
    text = path.read_text(encoding="utf-8")
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    dest = _CACHE / "ported" / key / path.name
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(port_source(text), encoding="utf-8")
    return dest


def suite_files() -> list[Path]:
    return sorted((source_dir() / "tests").glob("test_*.py"))


def _outcomes(report: Path, name: str) -> dict[str, str]:
    """{"<file>::<Class>::<test>": "passed" | "skipped" | "failed: <message>" | "error: ..."}
    from pytest's junit xml (the message: the first line of the exception, shortened)."""
    found: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        classes = case.get("classname", "").split(".")[1:]  # "<module>[.<Class>]"
        test_id = "::".join([name, *classes, case.get("name", "")])
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                message = (child.get("message") or "").strip().splitlines() or [""]
                outcome = f"{'failed' if child.tag == 'failure' else 'error'}: {message[0][:200]}"
                break
            if child.tag == "skipped":
                outcome = "skipped"
        found[test_id] = outcome
    return found


def run_file(path: Path, *, library: str, workdir: Path, timeout: float) -> dict[str, str]:
    """Run one test file (ported for accel) in its own pytest process."""
    target = workdir / path.name
    text = path.read_text(encoding="utf-8")
    target.write_text(port_source(text) if library == "accel" else text, encoding="utf-8")
    report = workdir / f"{path.stem}.xml"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "ACCELERATE_USE_CPU": "1", "ACCEL_COMPAT_CACHE": str(_CACHE)}
    for key in [k for k in env if k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                "MASTER_", "ACCEL_USE", "ACCELERATE_USE_F"))]:
        env.pop(key)
    try:
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "-c", os.devnull, "--rootdir", str(workdir), f"--junitxml={report}",
                        str(target)], cwd=workdir, env=env, capture_output=True,
                       timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {f"{path.name}::<file>": "timeout"}
    if not report.exists():
        return {f"{path.name}::<file>": "error"}
    return _outcomes(report, path.name)


def run_suite(*, library: str, files: Iterable[Path] | None = None,
              timeout: float = 600) -> dict[str, str]:
    """Every test of the suite and its outcome under ``library`` ("accel" or "accelerate")."""
    results: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for path in files if files is not None else suite_files():
            results.update(run_file(path, library=library, workdir=Path(tmp),
                                    timeout=timeout))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--library", choices=("accel", "accelerate"), default="accel")
    parser.add_argument("--write-baseline", action="store_true",
                        help="with --library accelerate: record its passing tests")
    parser.add_argument("--write-known", action="store_true",
                        help="with --library accel: record the baseline tests it fails")
    parser.add_argument("--out", type=Path, help="write every outcome to this JSON file")
    parser.add_argument("files", nargs="*", help="test file names (default: all)")
    args = parser.parse_args()
    files = [p for p in suite_files() if not args.files or p.name in args.files]
    start = time.perf_counter()
    results = run_suite(library=args.library, files=files)
    counts = Counter(v.split(":")[0] for v in results.values())
    print(f"{args.library}: {dict(counts)} in {time.perf_counter() - start:.0f} s")
    for name in sorted({k.split('::')[0] for k in results}):
        mine = Counter(v.split(":")[0] for k, v in results.items() if k.startswith(name + "::"))
        print(f"  {name:50s} {mine['passed']:4d} passed / {sum(mine.values()):4d}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    if args.write_baseline:
        passed = sorted(k for k, v in results.items() if v == "passed")
        BASELINE.write_text(json.dumps({"accelerate": VERSION, "passed": passed}, indent=1)
                            + "\n")
    if args.write_known:
        baseline = json.loads(BASELINE.read_text())["passed"]
        known = {name: results.get(name, "not run: its file crashed or timed out")
                 for name in baseline if results.get(name) != "passed"}
        KNOWN.write_text(json.dumps(known, indent=1, sort_keys=True) + "\n")
        print(f"{len(baseline) - len(known)} of {len(baseline)} baseline tests pass")


if __name__ == "__main__":
    main()
