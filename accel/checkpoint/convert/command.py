"""``accel convert-checkpoint ACCELERATE_DIR OUT_DIR``: the command around the converter.

The argument parsing lives in :mod:`accel.launch.cli` (so ``--help`` never imports torch); it
calls :func:`run_command` after parsing. Exit status: 0 converted (files that could not be
converted are listed as skipped), 1 refused (``--strict`` and something was skipped) or writing
failed (nothing written either way), 2 a usage error (missing source, existing output, not an
Accelerate checkpoint).

Example::

    $ accel convert-checkpoint runs/acc/checkpoint_3 runs/accel/checkpoint_3
    FILE                   RESULT     ACCEL FILE           DETAIL
    model.safetensors      converted  model_0.safetensors  2 tensors
    ...
"""

from __future__ import annotations

import json
import sys
from typing import TextIO

from ..storage import CheckpointError
from .api import convert_accelerate_checkpoint
from .report import ConversionRefused, ConversionReport

__all__ = ["run_command"]

_PROG = "accel convert-checkpoint"


def _summary(report: ConversionReport) -> str:
    skipped = len(report.skipped)
    head = (f"converted {len(report.converted)} file(s), skipped {skipped}; "
            f"{report.world_size} process(es)")
    if report.output is None:
        return f"{head}: refused (--strict), nothing written"
    return (f"{head}: wrote {report.output}; resume with "
            f"accelerator.load_state({str(report.output)!r})")


def _print(report: ConversionReport, *, as_json: bool, out: TextIO) -> None:
    if as_json:
        print(json.dumps(report.to_json(), indent=1), file=out)
    else:
        print(report.table(), file=out)
        print(_summary(report), file=out)


def run_command(source: str, *, output: str, strict: bool = False, overwrite: bool = False,
                as_json: bool = False) -> int:
    """Convert, print the table (or JSON with ``as_json``) and return the exit status."""
    try:
        report = convert_accelerate_checkpoint(source, output=output, strict=strict,
                                               overwrite=overwrite)
    except ConversionRefused as exc:
        _print(exc.report, as_json=as_json, out=sys.stdout)
        print(f"{_PROG}: error: {exc}", file=sys.stderr)
        return 1
    except (FileNotFoundError, FileExistsError, ValueError) as exc:
        print(f"{_PROG}: error: {exc}", file=sys.stderr)
        return 2
    except (OSError, CheckpointError) as exc:  # writing the output failed (disk, permissions)
        print(f"{_PROG}: error: writing {output} failed: {exc}; nothing was written (fix the "
              "cause, e.g. free space or permissions, and run it again)", file=sys.stderr)
        return 1
    _print(report, as_json=as_json, out=sys.stdout)
    return 0
