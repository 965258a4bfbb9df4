"""Configuration dataclasses and kwargs handlers, with Hugging Face Accelerate's field names.

Example:
    >>> from accel.config import DataLoaderConfiguration
    >>> DataLoaderConfiguration(even_batches=False).even_batches
    False
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any

from .._base.warn import warn_user

__all__ = [
    "AutocastKwargs",
    "DDPCommunicationHookType",
    "DataLoaderConfiguration",
    "DistributedDataParallelKwargs",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "LoggerType",
    "PrecisionType",
    "ProjectConfiguration",
    "parse_mixed_precision",
    "to_timedelta",
]


class DDPCommunicationHookType(str, enum.Enum):
    """A DDP gradient communication hook (``DistributedDataParallelKwargs(comm_hook=...)``).

    ``FP16``/``BF16`` all-reduce gradients compressed to that dtype; ``POWER_SGD`` and
    ``BATCHED_POWER_SGD`` use PowerSGD's low-rank compression (options in ``comm_state_option``).
    Members and values are Accelerate's.

    Example:
        >>> DDPCommunicationHookType("fp16") is DDPCommunicationHookType.FP16
        True
    """

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"


class LoggerType(str, enum.Enum):
    """An experiment tracker's name for ``Accelerator(log_with=...)``; members and values are
    Accelerate's (a member equals its string: ``LoggerType.WANDB == "wandb"``).

    accel runs every member (and its own ``jsonl`` and ``csv``, which have no member here: pass
    the string).

    Example:
        >>> LoggerType.COMETML == "comet_ml", LoggerType("wandb") is LoggerType.WANDB
        (True, True)
    """

    ALL = "all"
    AIM = "aim"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    TRACKIO = "trackio"
    COMETML = "comet_ml"
    MLFLOW = "mlflow"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    SWANLAB = "swanlab"

    def __str__(self) -> str:
        return str(self.value)  # as Accelerate's: f"{LoggerType.WANDB}" is "wandb"


class PrecisionType(str, enum.Enum):
    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"


def parse_mixed_precision(value: str | PrecisionType | None) -> PrecisionType:
    """Validate a mixed-precision name.

    Raises:
        ValueError: naming the accepted values.
    """
    if value is None:
        return PrecisionType.NO
    if isinstance(value, PrecisionType):
        return value
    if not isinstance(value, str):
        raise TypeError(f"mixed_precision must be a string, got {type(value).__name__}")
    key = value.strip().lower()
    aliases = {"": "no", "none": "no", "fp32": "no", "float16": "fp16", "bfloat16": "bf16"}
    key = aliases.get(key, key)
    try:
        return PrecisionType(key)
    except ValueError:
        raise ValueError(
            f"unknown mixed_precision {value!r}; expected one of 'no', 'fp16', 'bf16'"
        ) from None


def to_timedelta(value: float | int | timedelta | None, name: str = "timeout") -> timedelta | None:
    """Accept seconds or a timedelta; reject non-positive values."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, timedelta)):
        raise TypeError(f"{name} must be seconds (int/float) or a timedelta, got {value!r}")
    delta = value if isinstance(value, timedelta) else timedelta(seconds=float(value))
    if delta.total_seconds() <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return delta


class KwargsHandler:
    """Base of the kwargs handlers: ``to_kwargs()`` returns the fields changed from defaults."""

    def to_kwargs(self) -> dict[str, Any]:
        default = self.__class__()
        # fields() wants a dataclass instance: every concrete handler below is a @dataclass.
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)  # type: ignore[arg-type]
            if getattr(self, f.name) != getattr(default, f.name)
        }


def _hook_type(value: Any, name: str,
               allowed: tuple[DDPCommunicationHookType, ...]) -> DDPCommunicationHookType:
    try:
        member = DDPCommunicationHookType(value)
    except ValueError:
        member = None
    if member is None or member not in allowed:
        names = ", ".join(f"DDPCommunicationHookType.{m.name}" for m in allowed)
        raise ValueError(f"DistributedDataParallelKwargs({name}={value!r}) is not supported; "
                         f"expected one of {names}")
    return member


_POWER_SGD = (DDPCommunicationHookType.POWER_SGD, DDPCommunicationHookType.BATCHED_POWER_SGD)
#: fields that configure the communication hook, not the DDP constructor
_HOOK_FIELDS = ("comm_hook", "comm_wrapper", "comm_state_option")


@dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Arguments forwarded to ``torch.nn.parallel.DistributedDataParallel``, and its gradient
    communication hook.

    ``comm_hook`` picks a hook (:class:`DDPCommunicationHookType`); ``comm_wrapper`` (``FP16`` or
    ``BF16``) compresses what that hook sends; ``comm_state_option`` holds keyword arguments of
    ``PowerSGDState`` (e.g. ``{"matrix_approximation_rank": 2}``), for the PowerSGD hooks only.
    The hook is registered when the model is wrapped for DDP (a no-op on one process).

    Example:
        >>> kw = DistributedDataParallelKwargs(comm_hook="fp16", bucket_cap_mb=10)
        >>> kw.comm_hook is DDPCommunicationHookType.FP16, kw.to_kwargs()
        (True, {'bucket_cap_mb': 10})
    """

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_wrapper: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_state_option: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.comm_hook = _hook_type(self.comm_hook, "comm_hook", tuple(DDPCommunicationHookType))
        no, fp16, bf16 = (DDPCommunicationHookType.NO, DDPCommunicationHookType.FP16,
                          DDPCommunicationHookType.BF16)
        self.comm_wrapper = _hook_type(self.comm_wrapper, "comm_wrapper", (no, fp16, bf16))
        if not isinstance(self.comm_state_option, dict):
            raise TypeError("comm_state_option must be a dict of PowerSGDState arguments, got "
                            f"{type(self.comm_state_option).__name__}")
        # Accelerate ignores these silently; ignoring user configuration warns here (§3.8).
        if self.comm_wrapper is not no and self.comm_hook is no:
            warn_user(f"comm_wrapper={self.comm_wrapper.name} is ignored without a comm_hook; "
                      "set comm_hook too (e.g. DDPCommunicationHookType.POWER_SGD)")
        if self.comm_state_option and self.comm_hook not in _POWER_SGD:
            warn_user("comm_state_option is used by the PowerSGD hooks only and is ignored "
                      f"with comm_hook={self.comm_hook.name}; set comm_hook=POWER_SGD or "
                      "BATCHED_POWER_SGD, or drop it")

    def to_kwargs(self) -> dict[str, Any]:
        """The changed arguments of the DDP constructor (the hook fields are not among them)."""
        return {k: v for k, v in super().to_kwargs().items() if k not in _HOOK_FIELDS}


@dataclass
class GradScalerKwargs(KwargsHandler):
    """Arguments forwarded to ``torch.amp.GradScaler`` (fp16 only)."""

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """Arguments for ``torch.distributed.init_process_group``. ``backend=None`` picks per device."""

    backend: str | None = None
    init_method: str | None = None
    timeout: timedelta | float | None = None


@dataclass
class AutocastKwargs(KwargsHandler):
    """Arguments forwarded to ``torch.autocast``."""

    enabled: bool = True
    cache_enabled: bool | None = None


@dataclass
class GradientAccumulationPlugin(KwargsHandler):
    """Gradient accumulation settings (Accelerate's names)."""

    num_steps: int | None = None
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False

    def __post_init__(self) -> None:
        if self.num_steps is not None and (
            isinstance(self.num_steps, bool) or not isinstance(self.num_steps, int)
            or self.num_steps < 1
        ):
            raise ValueError(f"num_steps must be an integer >= 1, got {self.num_steps!r}")


@dataclass
class DataLoaderConfiguration:
    """How ``prepare()`` shards and feeds data loaders (Accelerate's fields and defaults).

    - ``use_stateful_dataloader``: ``load_state`` restores each prepared loader's exact
      position, so iterating it continues with the next unseen batch of the saved epoch (same
      shuffle order and worker seeds; accel tracks the position itself, torchdata is not
      needed; with torchdata installed the loaders are also its ``StatefulDataLoader``s, as
      Accelerate's are). Off by default, as in Accelerate: ``load_state`` then leaves loaders
      as they are, so a script that skips the batches already seen by hand
      (``skip_first_batches(loader, n)`` or ``if step < resume_step: continue``) trains on the
      same batches as under Accelerate.
    - ``use_seedable_sampler``: with ``True`` a shuffling sampler draws epoch ``e``'s order
      from ``data_seed + e`` (Accelerate's ``SeedableRandomSampler``). With ``False`` (the
      default) a map-style loader's sampler keeps drawing from its own generator, as in
      Accelerate: the user's (``DataLoader(..., generator=g)``), else a new one seeded by one
      draw of torch's global RNG in ``prepare()``; every pass starts from rank 0's generator
      state, so ranks agree and each epoch's order is the generator's next draw (as in plain
      PyTorch). Exact resume (``use_stateful_dataloader``) stores that state with the position;
      without it ``load_state`` leaves the generator as it is (as Accelerate does).
    - ``data_seed``: the shuffle seed with ``use_seedable_sampler=True`` (and the workers'
      seeds); by default rank 0's ``torch.initial_seed()``.
    - ``already_sharded``: the loader's iterable dataset already yields a different part of
      the data on each rank (per-rank file lists, webdataset's ``split_by_node``, a stream
      that reads ``RANK``), so ``prepare()`` keeps each rank's stream whole instead of
      splitting it again (the name Accelerate's proposals use). Without it accel still finds
      such streams: those of a known pre-split source (``split_dataset_by_node``, webdataset
      ``split_by_node``, MosaicML/litdata ``StreamingDataset``), and those whose length or
      first batches differ across ranks (with one warning naming this flag). Ranks whose
      stream ends first repeat their last batch, marked as padding, until the longest ends.
      Only for iterable datasets (a map-style dataset with it raises).
    - ``dispatch_batches=True``: rank 0 reads the loader and sends every rank its batches (for
      data only rank 0 can read, or that should be read once); batches may change shape from
      one to the next, and ``gather_for_metrics`` stays exact. ``None`` (the default) or
      ``False``: every rank reads its own shard, for iterable datasets too (Accelerate
      dispatches those by default).
    """

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False
    already_sharded: bool = False

    def __post_init__(self) -> None:
        if self.data_seed is not None and not isinstance(self.data_seed, int):
            raise TypeError(f"data_seed must be an int, got {self.data_seed!r}")


@dataclass
class ProjectConfiguration:
    """Where checkpoints and logs go (Accelerate's names).

    ``save_on_each_node``: for machines without a shared filesystem. ``save_state`` then writes
    a complete copy of each checkpoint on every machine (by its local main process, into that
    machine's ``output_dir`` or ``project_dir``; rotation with ``total_limit`` on each),
    ``load_state`` reads each machine's own copy, and ``save``/``save_model`` write on every
    machine, as in Accelerate. Machines that share the directory still write it once.

    Example:
        >>> ProjectConfiguration(project_dir="runs", save_on_each_node=True).logging_dir
        'runs'
    """

    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.logging_dir is None and self.project_dir is not None:
            self.logging_dir = self.project_dir
        if self.total_limit is not None and self.total_limit < 1:
            raise ValueError(f"total_limit must be >= 1 or None, got {self.total_limit}")
