"""What a conversion did with each file of the Accelerate directory: a table and JSON.

Example:
    >>> from pathlib import Path
    >>> report = ConversionReport(source=Path("acc"), output=Path("out"), world_size=1,
    ...     strict=False, files=[
    ...     FileResult(file="optimizer.bin", status=CONVERTED, written_as="optimizer_0",
    ...                detail="1 parameter group"),
    ...     FileResult(file="sampler.bin", status=SKIPPED, written_as=None,
    ...                detail="not convertible")])
    >>> print(report.table())
    FILE           RESULT     ACCEL FILE   DETAIL
    optimizer.bin  converted  optimizer_0  1 parameter group
    sampler.bin    skipped    -            not convertible
    >>> report.to_json()["skipped"]
    ['sampler.bin']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..storage import CheckpointError

__all__ = ["CONVERTED", "SKIPPED", "ConversionRefused", "ConversionReport", "FileResult"]

CONVERTED = "converted"
SKIPPED = "skipped"


@dataclass(frozen=True, kw_only=True, slots=True)
class FileResult:
    """One file (or directory) of the Accelerate checkpoint and what became of it."""

    file: str  # relative to the Accelerate directory
    status: str  # CONVERTED or SKIPPED
    written_as: str | None  # the accel component ("model_0.safetensors", "optimizer_0", ...)
    detail: str  # what was carried over, or why it was skipped and what to do


@dataclass(kw_only=True, slots=True)
class ConversionReport:
    """The outcome of :func:`~accel.checkpoint.convert_accelerate_checkpoint`.

    Attributes:
        source: the Accelerate ``save_state`` directory.
        output: the accel checkpoint written, or None when the conversion was refused.
        world_size: processes that wrote the Accelerate checkpoint (``random_states_<rank>``
            files), recorded as the accel checkpoint's world size.
        strict: whether any skipped file refuses the conversion.
        files: one entry per file or directory of ``source``, in name order.
        meta: what the manifest records about the source (optimizer steps, Accelerate's step).
    """

    source: Path
    output: Path | None
    world_size: int
    strict: bool
    files: list[FileResult]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def converted(self) -> list[FileResult]:
        return [f for f in self.files if f.status == CONVERTED]

    @property
    def skipped(self) -> list[FileResult]:
        return [f for f in self.files if f.status == SKIPPED]

    def table(self) -> str:
        """One line per file: name, result, accel file, detail (aligned columns)."""
        rows = [("FILE", "RESULT", "ACCEL FILE", "DETAIL")] + [
            (f.file, f.status, f.written_as or "-", f.detail) for f in self.files]
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        return "\n".join("  ".join([*(cell.ljust(w) for cell, w in zip(row, widths,
                                                                        strict=False)), row[3]])
                         .rstrip() for row in rows)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON for scripts (``accel convert-checkpoint --json``)."""
        return {"source": str(self.source),
                "output": None if self.output is None else str(self.output),
                "ok": self.output is not None, "world_size": self.world_size,
                "strict": self.strict, "meta": dict(self.meta),
                "files": [{"file": f.file, "status": f.status, "written_as": f.written_as,
                           "detail": f.detail} for f in self.files],
                "converted": [f.file for f in self.converted],
                "skipped": [f.file for f in self.skipped]}


class ConversionRefused(CheckpointError):
    """``strict=True`` and some files could not be converted; nothing was written.

    Attributes:
        report: what would have been converted and what was skipped (``report.output`` is None).
    """

    def __init__(self, report: ConversionReport) -> None:
        names = ", ".join(f.file for f in report.skipped)
        super().__init__(f"refused to convert {report.source} (strict): {len(report.skipped)} "
                         f"file(s) cannot be converted: {names}; see each file's reason, or "
                         "convert without strict to skip them", path=report.source)
        self.report = report
