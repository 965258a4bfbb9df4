"""``accel estimate-memory MODEL_SPEC``: the memory a model needs, from shapes alone.

The model is built on the ``meta`` device (``init_empty_weights()``), so nothing is allocated
and any size can be estimated on a laptop. For each dtype:

- *largest layer*: the biggest part that is placed whole (a module without children, or of a
  class in the model's ``_no_split_modules``), i.e. what offloading must bring in at once;
- *total size* and *inference*: every parameter and buffer at that dtype (floating-point
  tensors converted; integer buffers keep their dtype);
- *training with Adam*: weights + gradients (at the dtype) + Adam's two moments in fp32 (8
  bytes per trainable parameter), plus an fp32 master copy of the trainable parameters (4
  bytes each) when the dtype is not float32 (mixed precision). That is 16 bytes per parameter
  at float32, bf16 and fp16 alike.

Activations, temporary buffers, the CUDA context and fragmentation are NOT included: they
depend on the batch, the sequence length and the kernels, and can exceed the weights.

``MODEL_SPEC`` is ``package.module:function`` (the current directory is importable, as with
``python -m``) or ``path/to/file.py:function``; the function takes no argument and returns the
``torch.nn.Module``.

Example:
    >>> import torch
    >>> rows = estimate_memory(lambda: torch.nn.Linear(1000, 1000), ["float32", "bf16"])
    >>> [(row.dtype, row.total_bytes, row.training_bytes) for row in rows]
    [('float32', 4004000, 16016000), ('bfloat16', 2002000, 16016000)]
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import torch
from torch import nn

from .empty import init_empty_weights
from .placement import compute_module_sizes, get_max_layer_size
from .sizes import format_size, parse_dtype

__all__ = ["MemoryEstimate", "ModelSpecError", "estimate_memory", "load_model_builder",
           "run_estimate"]

_PROG = "accel estimate-memory"
_FP32_BYTES = 4
_NOTE = ("training = weights + gradients + Adam's 2 fp32 moments (+ fp32 master weights below "
         "float32); activations are not included")


class ModelSpecError(ValueError):
    """``MODEL_SPEC`` cannot be imported, or does not build a ``torch.nn.Module``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryEstimate:
    """What a model needs at one dtype, in bytes."""

    dtype: str
    parameters: int
    largest_layer: str
    largest_layer_bytes: int
    total_bytes: int
    inference_bytes: int
    training_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    master_weight_bytes: int


def estimate_memory(build: Callable[[], nn.Module] | nn.Module,
                    dtypes: Sequence[str | torch.dtype] = ("float32", "bfloat16", "float16")
                    ) -> list[MemoryEstimate]:
    """One :class:`MemoryEstimate` per dtype for the model that ``build()`` returns.

    Args:
        build: a function returning the model (called under ``init_empty_weights()``, so its
            parameters are never allocated), or a model already built (on any device).
        dtypes: the dtypes to estimate at.

    Raises:
        ModelSpecError: ``build()`` did not return a ``torch.nn.Module``.
    """
    model = build if isinstance(build, nn.Module) else _build_empty(build)
    trainable = [p for p in {id(p): p for p in model.parameters()}.values()
                 if p.requires_grad and (p.is_floating_point() or p.is_complex())]
    count = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    no_split = list(getattr(model, "_no_split_modules", None) or [])
    rows = []
    for dtype in (parse_dtype(d) for d in dtypes):
        sizes = compute_module_sizes(model, dtype)
        top: list[tuple[str, nn.Module | torch.Tensor]] = [
            *model.named_parameters(recurse=False), *model.named_children(),
            *model.named_buffers(recurse=False)]
        largest, names = get_max_layer_size(top, sizes, no_split)
        trainable_count = sum(p.numel() for p in trainable)
        grads = trainable_count * dtype.itemsize
        moments = 2 * _FP32_BYTES * trainable_count
        master = 0 if dtype == torch.float32 else _FP32_BYTES * trainable_count
        rows.append(MemoryEstimate(
            dtype=str(dtype).removeprefix("torch."), parameters=count,
            largest_layer=names[0] if names else "", largest_layer_bytes=largest,
            total_bytes=sizes[""], inference_bytes=sizes[""],
            training_bytes=sizes[""] + grads + moments + master, gradient_bytes=grads,
            optimizer_bytes=moments, master_weight_bytes=master))
    return rows


def _build_empty(build: Callable[[], nn.Module]) -> nn.Module:
    with init_empty_weights():
        model = build()
    if not isinstance(model, nn.Module):
        raise ModelSpecError(f"{getattr(build, '__name__', build)!r} returned "
                             f"{type(model).__name__}, not a torch.nn.Module; make it return "
                             "the model")
    return model


def load_model_builder(spec: str) -> Callable[[], nn.Module]:
    """The function named by ``spec``: ``package.module:function`` or ``file.py:function``.

    Raises:
        ModelSpecError: a malformed spec, a module or file that fails to import (with the
            reason), or a missing or non-callable attribute.
    """
    location, sep, attribute = spec.rpartition(":")
    if not sep or not location or not attribute.isidentifier():
        raise ModelSpecError(f"model spec {spec!r} is not of the form package.module:function "
                             "or path/to/file.py:function")
    module = _import_location(location, spec)
    found = getattr(module, attribute, None)
    if found is None or not callable(found):
        what = "is not callable" if found is not None else "is not defined there"
        raise ModelSpecError(f"model spec {spec!r}: {attribute!r} {what}; name a function "
                             f"of {location} that returns the model")
    return found  # type: ignore[no-any-return]


def _import_location(location: str, spec: str) -> Any:
    if location.endswith(".py"):
        path = Path(location)
        if not path.is_file():
            raise ModelSpecError(f"model spec {spec!r}: no file {path} (cwd {Path.cwd()})")
        loader_spec = importlib.util.spec_from_file_location(path.stem, path)
        assert loader_spec is not None and loader_spec.loader is not None
        module = importlib.util.module_from_spec(loader_spec)
        _run_import(lambda: loader_spec.loader.exec_module(module),  # type: ignore[union-attr]
                    spec)
        return module
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, "")  # as `python -m`: modules of the current directory import
    return _run_import(lambda: importlib.import_module(location), spec)


def _run_import(load: Callable[[], Any], spec: str) -> Any:
    try:
        return load()
    except (ImportError, SyntaxError) as exc:
        raise ModelSpecError(f"model spec {spec!r} failed to import: {type(exc).__name__}: "
                             f"{exc}; check the module path (the current directory and "
                             "PYTHONPATH are searched) or pass path/to/file.py:function") from exc


def table(rows: Sequence[MemoryEstimate]) -> str:
    """The rows as a text table, with the note on what training includes."""
    head = ("dtype", "largest layer", "total size", "inference", "training (Adam)")
    body = [(r.dtype, f"{format_size(r.largest_layer_bytes)} ({r.largest_layer})",
             format_size(r.total_bytes), format_size(r.inference_bytes),
             format_size(r.training_bytes)) for r in rows]
    widths = [max(len(line[i]) for line in (head, *body)) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
             for line in (head, *body)]
    count = rows[0].parameters if rows else 0
    return "\n".join([*lines, f"{count:,} parameters; {_NOTE}"])


def run_estimate(spec: str, *, dtypes: Sequence[str], as_json: bool = False,
                 out: TextIO | None = None) -> int:
    """Build, estimate and print (a table, or JSON); returns the exit status (2: bad spec)."""
    out = sys.stdout if out is None else out
    try:
        rows = estimate_memory(load_model_builder(spec), dtypes)
    except (ModelSpecError, ValueError) as exc:
        print(f"{_PROG}: error: {exc}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps({"model": spec, "note": _NOTE,
                          "estimates": [asdict(row) for row in rows]}, indent=1), file=out)
    else:
        print(f"memory needed by {spec}:", file=out)
        print(table(rows), file=out)
    return 0
