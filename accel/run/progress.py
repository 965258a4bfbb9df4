"""Progress bars shown by the main process only.

Example:
    >>> bar = tqdm(range(3), is_main=False)  # what every rank but 0 gets
    >>> bar.disable
    True
    >>> sum(bar)  # still iterates
    3
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["tqdm"]


def _is_main() -> bool:
    from ..env import detect_launch  # stdlib only; read lazily so it works before an Accelerator

    return detect_launch().rank == 0


def tqdm(
    iterable: Iterable[Any] | None = None,
    *args: Any,
    main_process_only: bool = True,
    is_main: bool | None = None,
    **kwargs: Any,
) -> Any:
    """``tqdm.auto.tqdm`` that is disabled on every process but the main one.

    Args:
        iterable: what to iterate over (as in tqdm).
        *args: further positional arguments of ``tqdm``.
        main_process_only: False shows the bar on every process.
        is_main: whether this is the main process; None reads the launcher environment
            (``Accelerator.tqdm`` passes its own answer).
        **kwargs: keyword arguments of ``tqdm``; the caller's ``disable`` applies on the
            main process.

    Example:
        >>> for batch in tqdm(range(2), desc="train", is_main=False):
        ...     pass
    """
    from tqdm.auto import tqdm as _tqdm  # tqdm is a dependency; imported on use

    if main_process_only:
        main = _is_main() if is_main is None else is_main
        if not main:  # on the main process the caller's disable (True/False/None) stands
            kwargs["disable"] = True
    return _tqdm(iterable, *args, **kwargs)
