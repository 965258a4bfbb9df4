"""Convert Hugging Face Accelerate ``save_state`` directories into accel checkpoints.

Layer L4, on top of :mod:`accel.checkpoint.storage` (it writes with the same writer as
``save_state``). Pickled files are read with ``torch.load(weights_only=True)`` only; what cannot
be read that way is reported by name and skipped (or, with ``strict``, refuses the conversion),
never executed. The command line is ``accel convert-checkpoint ACCELERATE_DIR OUT_DIR``.

- :mod:`.api`: :func:`convert_accelerate_checkpoint` and the mapping of files.
- :mod:`.report`: :class:`ConversionReport` (table and JSON), :class:`ConversionRefused`.
- :mod:`.command`: the command's body (``accel.launch.cli`` parses the arguments).

Example:
    >>> from accel.checkpoint import convert_accelerate_checkpoint
    >>> convert_accelerate_checkpoint.__name__
    'convert_accelerate_checkpoint'
"""

from __future__ import annotations

from .api import convert_accelerate_checkpoint
from .report import ConversionRefused, ConversionReport, FileResult

__all__ = ["ConversionRefused", "ConversionReport", "FileResult", "convert_accelerate_checkpoint"]
