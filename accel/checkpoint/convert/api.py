"""``convert_accelerate_checkpoint``: an Accelerate ``save_state`` directory -> an accel checkpoint.

The output is written by the same :class:`~accel.checkpoint.storage.CheckpointWriter` that
``save_state`` uses (temporary sibling, fsynced files, manifest with sizes and sha256 last,
atomic rename), so ``accelerator.load_state(output)`` loads it like one of its own.

Mapping (Accelerate -> accel):

- ``model[_i].safetensors`` / ``pytorch_model[_i].bin`` -> ``model_<i>.safetensors``
  (torch.compile's ``_orig_mod.`` key prefix removed, for a model compiled before prepare());
- ``optimizer[_i].bin`` -> ``optimizer_<i>``; ``scheduler[_i].bin`` -> ``scheduler_<i>``;
  ``scaler.pt`` -> ``scaler``; ``custom_checkpoint_<i>.pkl`` -> ``custom_<i>``;
- ``random_states_<rank>.pkl`` -> ``rank_<rank>/rng`` (python, numpy, torch, and the CUDA or
  XLA generator). The number of these files is the checkpoint's world size. Loading with another
  number of processes is accel's usual: model, optimizer, scheduler and registered state load
  on every rank; ranks beyond the saved ones are seeded from the step, extra saved ranks' RNG
  states are dropped, with one warning;
- data loader state (``sampler.bin``, ``dl_state_dict.bin``) is not converted: the checkpoint
  records that it has no loader positions, and ``load_state`` leaves the prepared loaders where
  they are (with a warning), as Accelerate's ``load_state`` does for ordinary loaders.

The manifest's step is the optimizer step count (the largest per-parameter ``step`` of the
optimizer states, 0 if they keep none); the gradient accumulation micro-step is 0.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..storage import CheckpointWriter
from ._components import Facts, NotConvertible, convert_entry
from ._layout import Entry, scan
from ._safe import Unreadable
from .report import SKIPPED, ConversionRefused, ConversionReport, FileResult

__all__ = ["convert_accelerate_checkpoint"]

_RECOGNISED = {"model", "optimizer", "scheduler", "scaler", "rng", "custom", "sampler", "loader",
               "fsdp"}


def _check_paths(source: Path, *, output: Path, overwrite: bool) -> None:
    if not source.is_dir():
        raise FileNotFoundError(f"{source} is not a directory; pass the directory that "
                                "Accelerate's accelerator.save_state() wrote")
    src, out = source.resolve(), output.resolve()
    if out == src or src in out.parents or out in src.parents:
        raise ValueError(f"the output {output} must be outside the Accelerate checkpoint "
                         f"{source} (and not contain it); pick a new directory")
    if output.exists() and not output.is_dir():
        raise FileExistsError(f"{output} exists and is not a directory; pick a new directory")
    if output.exists() and not overwrite:
        raise FileExistsError(f"{output} already exists; pick a new directory, or pass "
                              "overwrite=True (--overwrite) to replace it")


def _world_size(entries: list[Entry]) -> int:
    ranks = [e.index for e in entries if e.kind == "rng"]
    return max(ranks) + 1 if ranks else 1


def _convert_one(writer: CheckpointWriter, *, source: Path, entry: Entry, facts: Facts,
                 taken: set[tuple[str, int]]) -> FileResult:
    key = (entry.kind, entry.index)
    if entry.kind == "model" and key in taken:
        return FileResult(file=entry.name, status=SKIPPED, written_as=None,
                          detail=f"a second file for model {entry.index} "
                          f"(model_{entry.index}.safetensors was written from the other); "
                          "not read")
    taken.add(key)
    try:
        return convert_entry(writer, source=source, entry=entry, facts=facts)
    except (Unreadable, NotConvertible) as exc:
        return FileResult(file=entry.name, status=SKIPPED, written_as=None, detail=str(exc))
    except TypeError as exc:  # the codec: a value that cannot be stored without pickle
        return FileResult(file=entry.name, status=SKIPPED, written_as=None, detail=str(exc))
    except (ValueError, RuntimeError, KeyError, IndexError, AttributeError) as exc:
        # content that loaded but is not shaped like what Accelerate writes there
        return FileResult(file=entry.name, status=SKIPPED, written_as=None,
                          detail=f"cannot be converted: {type(exc).__name__}: {exc}")


def _missing_ranks(entries: list[Entry], world_size: int) -> list[FileResult]:
    present = {e.index for e in entries if e.kind == "rng"}
    return [FileResult(file=f"random_states_{rank}.pkl", status=SKIPPED, written_as=None,
                       detail=f"missing: rank {rank}'s RNG state was not saved here (load_state on "
                       f"{world_size} processes then fails on rank {rank}; a job with fewer "
                       "processes does not need it)")
            for rank in range(world_size) if rank not in present]


def _meta(facts: Facts, source: Path) -> dict[str, object]:
    """The manifest meta the checkpoint protocol reads (keys as protocol/save.py writes them)."""
    return {"accumulation_step": 0, "optimizer_steps": facts.optimizer_steps,
            "counts": dict(facts.counts),  # no "loaders": Accelerate does not record them
            "loader_positions": False,
            "converted_from": {"format": "accelerate save_state", "source": os.fspath(source),
                               "accelerate_step": facts.accelerate_step,
                               "world_size": facts.world_size}}


def convert_accelerate_checkpoint(source: str | os.PathLike[str],
                                  *, output: str | os.PathLike[str], strict: bool = False,
                                  overwrite: bool = False) -> ConversionReport:
    """Convert a directory written by Accelerate's ``save_state`` into an accel checkpoint.

    Pickled files are read with ``torch.load(weights_only=True)`` only (numpy arrays allowed);
    a file that needs a full unpickler is never loaded: it is listed in the report with the
    globals it names, and skipped. See :mod:`accel.checkpoint.convert.api` for the mapping.

    Args:
        source: the Accelerate checkpoint directory.
        output: the accel checkpoint directory to write (atomically).
        strict: refuse (write nothing) if any file cannot be converted.
        overwrite: replace ``output`` if it exists.

    Returns:
        What became of every file; ``report.output`` is the checkpoint written.

    Raises:
        FileNotFoundError: ``source`` is not a directory.
        FileExistsError: ``output`` exists and ``overwrite`` is false.
        ValueError: ``source`` holds no file of Accelerate's ``save_state``, or ``output`` and
            ``source`` overlap.
        ConversionRefused: ``strict`` and some file could not be converted (``.report``).

    Example:
        >>> import tempfile, torch
        >>> from pathlib import Path
        >>> acc = Path(tempfile.mkdtemp())
        >>> torch.save({"state": {}, "param_groups": [{"lr": 0.1, "params": [0]}]},
        ...            acc / "optimizer.bin")
        >>> torch.save({"random_state": __import__("random").getstate(),
        ...             "numpy_random_seed": __import__("numpy").random.get_state(),
        ...             "torch_manual_seed": torch.get_rng_state(), "step": 0},
        ...            acc / "random_states_0.pkl")
        >>> report = convert_accelerate_checkpoint(acc, output=acc.parent / (acc.name + "-accel"))
        >>> [(f.file, f.written_as) for f in report.files]
        [('optimizer.bin', 'optimizer_0'), ('random_states_0.pkl', 'rank_0/rng')]
    """
    source, target = Path(source), Path(output)
    _check_paths(source, output=target, overwrite=overwrite)
    entries = scan(source)
    if not any(e.kind in _RECOGNISED for e in entries):
        raise ValueError(f"{source} holds no file of Accelerate's save_state (model.safetensors, "
                         "optimizer.bin, random_states_0.pkl, ...); pass the directory that "
                         "accelerator.save_state() wrote (with automatic checkpoint naming, one "
                         "of the checkpoints/checkpoint_<n> folders)")
    return _write(source, target=target, entries=entries, strict=strict)


def _write(source: Path, *, target: Path, entries: list[Entry], strict: bool) -> ConversionReport:
    """Convert every entry into a temporary sibling of ``target``; seal it, or remove it."""
    facts = Facts(world_size=_world_size(entries))
    writer = CheckpointWriter(target)
    try:
        taken: set[tuple[str, int]] = set()
        results = [_convert_one(writer, source=source, entry=e, facts=facts,
                                taken=taken) for e in entries]
        results += _missing_ranks(entries, facts.world_size)
        report = ConversionReport(source=source, output=None, world_size=facts.world_size,
                                  strict=strict, files=results, meta=_meta(facts, source))
        if strict and report.skipped:
            raise ConversionRefused(report)
        report.output = writer.finalize(step=facts.optimizer_steps,
                                        world_size=facts.world_size, meta=report.meta)
    except BaseException:
        writer.abort()
        raise
    return report
