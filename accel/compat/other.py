"""Accelerate's ``accelerate.utils.other``: unwrapping models, patching the environment, and
writing the default config file.

Example:
    >>> import torch
    >>> is_compiled_module(nn.Linear(1, 1))
    False
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch import nn

from .. import env
from .._base.warn import warn_user
from ..config.settings import parse_mixed_precision
from ..device import DEVICE_KINDS
from ..precision import remove_forward_wrapper
from ..strategy import unwrap_module
from ..strategy.compile import compile_regions, has_compiled_regions, is_compiled_module

__all__ = ["compile_regions", "extract_model_from_parallel", "has_compiled_regions",
           "is_compiled_module", "patch_environment", "write_basic_config"]


@contextlib.contextmanager
def patch_environment(**kwargs: Any) -> Iterator[None]:
    """Set environment variables for the block (names upper-cased, values ``str()``-ed), then
    restore what was there before, also when the block raises.

    Example:
        >>> import os
        >>> with patch_environment(accel_doc_example=1):
        ...     os.environ["ACCEL_DOC_EXAMPLE"]
        '1'
        >>> "ACCEL_DOC_EXAMPLE" in os.environ
        False
    """
    with env.patched({name.upper(): str(value) for name, value in kwargs.items()}):
        yield


def extract_model_from_parallel(model: nn.Module, keep_fp32_wrapper: bool = True,
                                keep_torch_compile: bool = True) -> nn.Module:
    """The user's model inside the DDP (and, unless kept, ``torch.compile``) wrappers.

    Args:
        model: a model returned by ``prepare()``, possibly compiled.
        keep_fp32_wrapper: False also removes the mixed-precision forward wrapper.
        keep_torch_compile: a compiled model comes back compiled: ``torch.compile(module)``
            rather than ``torch.compile(DDP(module))`` (then a new wrapper with the same
            settings; the one being trained is left as it is).

    Example:
        >>> net = nn.Linear(1, 1)
        >>> extract_model_from_parallel(net) is net
        True
    """
    inner = unwrap_module(model)
    result = unwrap_module(model, keep_torch_compile=True) if keep_torch_compile else inner
    if not keep_fp32_wrapper:
        for module in {id(result): result, id(inner): inner}.values():
            remove_forward_wrapper(module)
    return result


def write_basic_config(mixed_precision: str = "no",
                       save_location: str | os.PathLike[str] | None = None) -> Path | bool:
    """Write the config file that ``accel config default`` writes (Accelerate's keys, so both
    tools read it): one machine, every visible GPU, else one CPU process.

    Args:
        mixed_precision: ``"no"``, ``"fp16"`` or ``"bf16"``.
        save_location: where to write; by default where ``accel launch`` looks
            (``$ACCEL_CONFIG_FILE``, else ``~/.config/accel/default_config.yaml``).

    Returns:
        The path written, or False (with a warning) when the file exists already: it is never
        overwritten (as in Accelerate).
    """
    # launch/ is the side layer: imported lazily here so that `accel config default` and this
    # function share one writer (tests/unit/test_architecture.py, SIDE_USERS, says why).
    from ..launch.config_cmd import default_values
    from ..launch.config_file import default_config_path, write_config

    precision = parse_mixed_precision(mixed_precision).value
    path = Path(save_location).expanduser() if save_location is not None \
        else default_config_path()[0]
    if path.exists():
        warn_user(f"write_basic_config: {path} already exists and was left unchanged; edit "
                  "it with `accel config`, or pass another save_location")
        return False
    return write_config(path, default_values(DEVICE_KINDS["cuda"].count(), precision))
