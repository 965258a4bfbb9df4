"""FSDP2 settings with Hugging Face Accelerate's names: ``FullyShardedDataParallelPlugin`` (and
the ``accel launch`` settings of it and of ``ParallelismConfig``).

accel shards with PyTorch's own FSDP2 (``torch.distributed.fsdp.fully_shard``). The plugin takes
Accelerate's field names and spellings; fields that only FSDP1 had are mapped to their FSDP2
equivalent where one exists (``sharding_strategy="SHARD_GRAD_OP"`` is
``reshard_after_forward=False``) and refused, naming the FSDP2 field to use, where none does.
After construction every field holds one normalised form (strings upper- or lower-cased as
below, booleans, a torch ``MixedPrecisionPolicy``), which is what the FSDP strategy reads.

The plugin never reads the environment: ``accel launch --use_fsdp --fsdp_*`` flags and an
Accelerate config file's ``fsdp_config`` block reach a worker as ``ACCEL_FSDP_*`` settings, and
the connector builds the plugin from them when ``Accelerator(fsdp_plugin=...)`` is not given.

Example:
    >>> plugin = FullyShardedDataParallelPlugin(sharding_strategy="SHARD_GRAD_OP",
    ...                                         auto_wrap_policy="TRANSFORMER_BASED_WRAP",
    ...                                         transformer_cls_names_to_wrap="Block,Layer")
    >>> plugin.reshard_after_forward, plugin.auto_wrap_policy, plugin.transformer_cls_names_to_wrap
    (False, 'transformer_based_wrap', ['Block', 'Layer'])
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from .._base.parse import FALSE_WORDS, TRUE_WORDS
from .._base.warn import warn_user
from .parallelism import ParallelismConfig

if TYPE_CHECKING:
    import torch

__all__ = ["FullyShardedDataParallelPlugin", "LAUNCH_FSDP", "LAUNCH_PARALLELISM",
           "STATE_DICT_TYPES", "WRAP_POLICIES", "parallelism_from_launch",
           "plugin_from_launch"]

_T = TypeVar("_T")

#: ``auto_wrap_policy`` names (Accelerate's, case-insensitive on input)
WRAP_POLICIES = ("transformer_based_wrap", "size_based_wrap", "no_wrap")
#: ``state_dict_type`` names FSDP2 supports (``LOCAL_STATE_DICT`` was FSDP1's only)
STATE_DICT_TYPES = ("FULL_STATE_DICT", "SHARDED_STATE_DICT")

# FSDP1's ShardingStrategy by name and by number (torch's enum values, which Accelerate accepts
# too): what FSDP2 does instead (reshard_after_forward, hybrid mesh), or None when FSDP2 has no
# equivalent. Accelerate spells the last one without torch's leading underscore.
_SHARDING = {"FULL_SHARD": (True, False), "SHARD_GRAD_OP": (False, False), "NO_SHARD": None,
             "HYBRID_SHARD": (True, True), "HYBRID_SHARD_ZERO2": (False, True)}
_SHARDING_BY_NUMBER = dict(zip("12345", _SHARDING, strict=True))
# FSDP1's BackwardPrefetch by name and number; FSDP2 always prefetches before backward (PRE).
_PREFETCH = {"BACKWARD_PRE": "BACKWARD_PRE", "1": "BACKWARD_PRE", "BACKWARD_POST": "BACKWARD_POST",
             "2": "BACKWARD_POST", "NO_PREFETCH": "NO_PREFETCH"}
# torch's StateDictType by name and number, and short names
_STATE_DICT = {"1": "FULL_STATE_DICT", "2": "LOCAL_STATE_DICT", "3": "SHARDED_STATE_DICT",
               "FULL": "FULL_STATE_DICT", "SHARDED": "SHARDED_STATE_DICT"}
_DTYPES = {"fp32": "float32", "float32": "float32", "no": "float32", "bf16": "bfloat16",
           "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16"}
# the words every accel setting accepts, and Accelerate's str_to_bool's "y" / "n"
_TRUE, _FALSE = (*TRUE_WORDS, "y"), (*FALSE_WORDS, "n")


def _flag(value: Any, name: str) -> bool:
    """A boolean from a bool or a spelling of one (Accelerate's config files write strings)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ValueError(f"FullyShardedDataParallelPlugin({name}={value!r}): expected True or False")


def _is_flag(value: Any) -> bool:
    return isinstance(value, bool) or str(value).strip().lower() in {*_TRUE, *_FALSE}


def _enum_name(value: Any) -> str:
    """An enum's name, an int's digits, or a string upper-cased (``"hybrid_shard"``)."""
    name = getattr(value, "name", None)
    return str(name) if isinstance(name, str) else str(value).strip().upper()


def _sharding_name(value: Any, field_name: str = "sharding_strategy") -> str:
    """FSDP1 ``ShardingStrategy`` (enum, name or number 1-5) as Accelerate's name."""
    name = _enum_name(value).lstrip("_")
    name = _SHARDING_BY_NUMBER.get(name, name)
    if name not in _SHARDING:
        raise ValueError(f"{field_name}={value!r} is not an FSDP1 sharding strategy; expected "
                         f"one of {', '.join(_SHARDING)} or 1-5 (or, better, FSDP2's "
                         "reshard_after_forward=True/False)")
    return name


def _dtype(value: Any, name: str) -> torch.dtype | None:
    import torch

    if value is None or isinstance(value, torch.dtype):
        return value
    dtype = _DTYPES.get(str(value).strip().lower())
    if dtype is None:
        raise ValueError(f"mixed_precision_policy {name}={value!r}: expected one of "
                         f"{', '.join(sorted(_DTYPES))} or a torch.dtype")
    result: torch.dtype = getattr(torch, dtype)
    return result


def _mixed_precision(value: Any) -> Any:
    """``MixedPrecisionPolicy`` from a policy, a dict of dtypes or a mode name ("bf16")."""
    if value is None:
        return None
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if isinstance(value, MixedPrecisionPolicy):
        return value
    if isinstance(value, str):
        dtype = _dtype(value, "mode")
        if dtype is torch.float32:
            return None
        return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype)
    if isinstance(value, dict):
        known = {"param_dtype", "reduce_dtype", "output_dtype", "cast_forward_inputs"}
        extra = set(value) - known - {"buffer_dtype"}
        if extra:
            raise ValueError(f"mixed_precision_policy has unknown keys {sorted(extra)}; FSDP2's "
                             f"MixedPrecisionPolicy takes {sorted(known)}")
        if value.get("buffer_dtype") is not None:
            warn_user("mixed_precision_policy: buffer_dtype is FSDP1's; FSDP2 keeps buffers "
                      "in the module's dtype (cast them yourself if needed)")
        kwargs: dict[str, Any] = {k: _dtype(v, k) for k, v in value.items()
                                  if k in known - {"cast_forward_inputs"}}
        if "cast_forward_inputs" in value:
            kwargs["cast_forward_inputs"] = _flag(value["cast_forward_inputs"],
                                                  "cast_forward_inputs")
        return MixedPrecisionPolicy(**kwargs)
    raise TypeError("mixed_precision_policy must be a torch.distributed.fsdp.MixedPrecisionPolicy, "
                    f"a dict of dtypes or a mode name such as 'bf16', got {type(value).__name__}")


@dataclass
class FullyShardedDataParallelPlugin:
    """How models are sharded with FSDP2; ``Accelerator(fsdp_plugin=...)``.

    Field names and accepted spellings are Accelerate's. The FSDP2 fields:

    - ``reshard_after_forward``: free the gathered parameters after forward (ZeRO-3, the
      default) or keep them until backward (ZeRO-2, ``False``). It applies to the units; the
      root, whose backward starts right after forward, keeps its parameters (as
      ``fully_shard`` does by default).
    - ``auto_wrap_policy``: which submodules become units of their own, sharded and gathered
      one at a time: ``"transformer_based_wrap"`` (instances of
      ``transformer_cls_names_to_wrap``, default the model's ``_no_split_modules``),
      ``"size_based_wrap"`` (modules holding at least ``min_num_params`` parameters not
      already in a unit), ``"no_wrap"`` (only the root), or a callable ``policy(module) ->
      bool`` (torch's FSDP1 policy functions are accepted too).
    - ``mixed_precision_policy``: a ``MixedPrecisionPolicy``, a dict of its dtypes, or a mode
      (``"bf16"``); ``Accelerator(mixed_precision="bf16")`` sets bf16 parameters and
      reductions when this is not given.
    - ``cpu_offload``: keep the sharded parameters, gradients and optimizer states in CPU memory.
    - ``activation_checkpointing``: recompute each unit's activations in backward.
    - ``state_dict_type``: ``"SHARDED_STATE_DICT"`` (default; ``save_state`` writes each rank's
      shards, loadable at any world size) or ``"FULL_STATE_DICT"`` (gathered on rank 0).
    - ``cpu_ram_efficient_loading``: rank 0 holds the real weights, the other ranks build the
      model under ``init_empty_weights()``; ``prepare`` sends each rank only its shards.
    - ``ignored_modules``: modules (or a regex over module names) that are not sharded.
    - ``sync_module_states``: start every rank from rank 0's weights (as DDP does; default True).
    """

    fsdp_version: int | None = None
    sharding_strategy: Any = None
    reshard_after_forward: bool | str | None = None
    backward_prefetch: Any = None
    mixed_precision_policy: Any = None
    auto_wrap_policy: Callable[..., Any] | str | None = None
    cpu_offload: Any = None
    ignored_modules: Iterable[torch.nn.Module] | str | None = None
    state_dict_type: Any = None
    state_dict_config: Any = None
    optim_state_dict_config: Any = None
    limit_all_gathers: bool = True
    use_orig_params: bool | None = None
    param_init_fn: Callable[[torch.nn.Module], None] | None = None
    sync_module_states: bool | None = None
    forward_prefetch: bool | None = None
    activation_checkpointing: bool | None = None
    activation_checkpointing_offload: bool | None = None
    cpu_ram_efficient_loading: bool | None = None
    transformer_cls_names_to_wrap: list[str] | str | None = None
    min_num_params: int | None = None
    #: from an FSDP1 ``sharding_strategy``: True (HYBRID_*: shard within a node, replicate
    #: across nodes), False (FULL_SHARD, SHARD_GRAD_OP: shard across all ranks), None (not
    #: given: hybrid on several nodes, as the device mesh defaults)
    hybrid: bool | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self._map_fsdp1()
        self.reshard_after_forward = True if self.reshard_after_forward is None else \
            _flag(self.reshard_after_forward, "reshard_after_forward")
        self._normalise_wrap()
        self.mixed_precision_policy = _mixed_precision(self.mixed_precision_policy)
        self.cpu_offload = self._offload(self.cpu_offload)
        self._normalise_state_dict_type()
        for name in ("activation_checkpointing", "cpu_ram_efficient_loading"):
            value = getattr(self, name)
            setattr(self, name, False if value is None else _flag(value, name))
        self.sync_module_states = True if self.sync_module_states is None else \
            _flag(self.sync_module_states, "sync_module_states")
        if isinstance(self.ignored_modules, str) and not self.ignored_modules.strip():
            self.ignored_modules = None

    # -- FSDP1 fields ---------------------------------------------------------------------------
    def _map_fsdp1(self) -> None:
        if str(self.fsdp_version).strip() not in ("None", "1", "2"):
            raise ValueError(f"fsdp_version={self.fsdp_version!r}: accel runs FSDP2; pass 2")
        if str(self.fsdp_version).strip() == "1":
            warn_user("fsdp_version=1: accel shards with FSDP2 (fully_shard); the FSDP1 "
                      "settings are mapped to FSDP2's (pass fsdp_version=2 to silence this)")
        self.fsdp_version = 2
        strategy, given = self.sharding_strategy, self.reshard_after_forward
        if given is not None and not _is_flag(given):
            # Accelerate's FSDP1 spelling of the field: a sharding strategy (name, number, enum)
            if _enum_name(given).lstrip("_") not in {*_SHARDING, *_SHARDING_BY_NUMBER}:
                raise ValueError(f"reshard_after_forward={given!r}: expected True or False (or, "
                                 "as FSDP1 spelled it, a sharding strategy: "
                                 f"{', '.join(_SHARDING)})")
            name = _sharding_name(given, "reshard_after_forward")
            if strategy is not None and _sharding_name(strategy) != name:
                raise ValueError(f"sharding_strategy={strategy!r} and reshard_after_forward="
                                 f"{given!r} disagree; pass only reshard_after_forward")
            strategy, given = name, None
        if strategy is not None:
            name = _sharding_name(strategy)
            mapped = _SHARDING[name]
            if mapped is None:
                raise ValueError("sharding_strategy=NO_SHARD replicates the whole model, which "
                                 "FSDP2 does not do: drop fsdp_plugin (and --use_fsdp) to use "
                                 "DDP, or pass parallelism_config=ParallelismConfig("
                                 "dp_replicate_size=N)")
            if given is not None and _flag(given, "reshard_after_forward") != mapped[0]:
                raise ValueError(f"sharding_strategy={name} and reshard_after_forward={given!r} "
                                 "disagree; pass only reshard_after_forward (FSDP2's field)")
            given, self.hybrid = mapped
        self.reshard_after_forward = given
        self.sharding_strategy = None
        self._refuse_fsdp1_only()

    def _refuse_fsdp1_only(self) -> None:
        if self.backward_prefetch is not None:
            prefetch = _PREFETCH.get(_enum_name(self.backward_prefetch))
            if prefetch is None:
                raise ValueError(f"backward_prefetch={self.backward_prefetch!r}: expected one of "
                                 "BACKWARD_PRE, BACKWARD_POST, NO_PREFETCH (FSDP1's; FSDP2 "
                                 "always prefetches before backward, so drop it)")
            if prefetch == "BACKWARD_POST":
                warn_user("backward_prefetch=BACKWARD_POST is FSDP1's; FSDP2 always "
                          "prefetches the next unit before its backward (BACKWARD_PRE)")
        self.backward_prefetch = None
        if self.use_orig_params is not None and not _flag(self.use_orig_params,
                                                          "use_orig_params"):
            warn_user("use_orig_params=False is FSDP1's flat-parameter mode; FSDP2 always "
                      "trains the original parameters (drop the setting)")
        offload = self.activation_checkpointing_offload
        refused = {
            "state_dict_config": (self.state_dict_config is not None, "state_dict_type"),
            "optim_state_dict_config": (self.optim_state_dict_config is not None,
                                        "state_dict_type"),
            "forward_prefetch": (self.forward_prefetch is not None and
                                 _flag(self.forward_prefetch, "forward_prefetch"),
                                 "nothing (FSDP2 has no forward prefetch setting; drop it)"),
            "param_init_fn": (self.param_init_fn is not None, "cpu_ram_efficient_loading=True "
                              "(with the model built under init_empty_weights() on ranks > 0)"),
            "activation_checkpointing_offload": (
                offload is not None and _flag(offload, "activation_checkpointing_offload"),
                "activation_checkpointing=True (recomputation, no offload)"),
        }
        for name, (given, instead) in refused.items():
            if given:
                raise ValueError(f"FullyShardedDataParallelPlugin({name}=...) has no FSDP2 "
                                 f"equivalent in accel; use {instead}")
        self.use_orig_params = self.forward_prefetch = None
        self.activation_checkpointing_offload = None

    # -- FSDP2 fields ---------------------------------------------------------------------------
    def _normalise_wrap(self) -> None:
        names = self.transformer_cls_names_to_wrap
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",") if n.strip()]
        self.transformer_cls_names_to_wrap = list(names) if names else None
        policy = self.auto_wrap_policy
        if policy is None:
            policy = "transformer_based_wrap" if self.transformer_cls_names_to_wrap else "no_wrap"
        if isinstance(policy, str):
            policy = policy.strip().lower()
            if policy not in WRAP_POLICIES:
                raise ValueError(f"auto_wrap_policy={self.auto_wrap_policy!r}: expected one of "
                                 f"{', '.join(WRAP_POLICIES)} (any case) or a callable")
        elif not callable(policy):
            raise TypeError("auto_wrap_policy must be a policy name or a callable "
                            f"policy(module) -> bool, got {type(policy).__name__}")
        self.auto_wrap_policy = policy
        if self.min_num_params is None:
            self.min_num_params = 100_000_000  # torch's size_based_auto_wrap_policy default
        elif isinstance(self.min_num_params, bool) or not str(self.min_num_params).isdigit():
            raise ValueError(f"min_num_params must be a non-negative integer, got "
                             f"{self.min_num_params!r}")
        self.min_num_params = int(self.min_num_params)
        if policy == "size_based_wrap" and self.min_num_params == 0:
            self.auto_wrap_policy = "no_wrap"  # Accelerate: a size of 0 wraps nothing

    @staticmethod
    def _offload(value: Any) -> bool:
        if value is None:
            return False
        if hasattr(value, "offload_params"):  # FSDP1's CPUOffload(offload_params=...)
            return bool(value.offload_params)
        if type(value).__name__ == "CPUOffloadPolicy":  # FSDP2's own policy object
            return True
        if type(value).__name__ == "OffloadPolicy":  # FSDP2's "no offload" base policy
            return False
        return _flag(value, "cpu_offload")

    def _normalise_state_dict_type(self) -> None:
        value = self.state_dict_type
        name = "SHARDED_STATE_DICT" if value is None else _enum_name(value)
        name = _STATE_DICT.get(name, name)
        if name not in STATE_DICT_TYPES:
            raise ValueError(f"state_dict_type={value!r}: FSDP2 saves FULL_STATE_DICT or "
                             "SHARDED_STATE_DICT (LOCAL_STATE_DICT was FSDP1's)")
        self.state_dict_type = name

    def set_state_dict_type(self, state_dict_type: Any = None) -> None:
        """Switch between full and sharded checkpoints (Accelerate's method), e.g. to save a
        final full checkpoint of a run that saved sharded ones; None keeps the current type."""
        if state_dict_type is not None:
            self.state_dict_type = state_dict_type
        self._normalise_state_dict_type()

    def set_mixed_precision(self, mixed_precision: Any, override: bool = False) -> None:
        """Set the policy from a mode (``"bf16"``) unless one is set (or ``override``)."""
        if self.mixed_precision_policy is None or override:
            self.mixed_precision_policy = _mixed_precision(mixed_precision)

    @property
    def sharded_state(self) -> bool:
        """``save_state`` writes each rank's shards (rather than full state on rank 0)."""
        return bool(self.state_dict_type == "SHARDED_STATE_DICT")


# -- accel launch ------------------------------------------------------------------------------
#: ``accel launch`` settings (Accelerate's ``--fsdp_*`` flag and ``fsdp_config`` key names) and
#: the plugin field each one sets; a worker gets them as ``ACCEL_<NAME>`` variables.
LAUNCH_FSDP = {
    "fsdp_version": "fsdp_version", "fsdp_sharding_strategy": "sharding_strategy",
    "fsdp_reshard_after_forward": "reshard_after_forward", "fsdp_offload_params": "cpu_offload",
    "fsdp_auto_wrap_policy": "auto_wrap_policy",
    "fsdp_transformer_layer_cls_to_wrap": "transformer_cls_names_to_wrap",
    "fsdp_min_num_params": "min_num_params", "fsdp_backward_prefetch": "backward_prefetch",
    "fsdp_state_dict_type": "state_dict_type", "fsdp_forward_prefetch": "forward_prefetch",
    "fsdp_use_orig_params": "use_orig_params",
    "fsdp_cpu_ram_efficient_loading": "cpu_ram_efficient_loading",
    "fsdp_sync_module_states": "sync_module_states",
    "fsdp_activation_checkpointing": "activation_checkpointing",
    "fsdp_activation_checkpointing_offload": "activation_checkpointing_offload",
    "fsdp_ignored_modules": "ignored_modules",
}
#: ``accel launch`` settings (``--parallelism_config_*``) and the ``ParallelismConfig`` field.
LAUNCH_PARALLELISM = {f"parallelism_config_{name}": name for name in (
    "dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size")}


def plugin_from_launch(values: Mapping[str, Any], where: Callable[[str], str] = str
                       ) -> FullyShardedDataParallelPlugin:
    """The plugin that ``accel launch`` settings describe (``LAUNCH_FSDP`` names, values as
    flags and config files write them); an error names the setting, as ``where(name)`` says.

    Example:
        >>> plugin_from_launch({"fsdp_reshard_after_forward": "false"}).reshard_after_forward
        False
        >>> plugin_from_launch({"fsdp_state_dict_type": "LOCAL"}, lambda n: "--" + n)
        Traceback (most recent call last):
        ValueError: --fsdp_state_dict_type 'LOCAL': state_dict_type='LOCAL': FSDP2 saves ...
    """
    unknown = set(values) - set(LAUNCH_FSDP)
    if unknown:
        raise ValueError(f"unknown FSDP settings {sorted(unknown)}; expected some of "
                         f"{', '.join(LAUNCH_FSDP)}")
    return _build(FullyShardedDataParallelPlugin, fields=LAUNCH_FSDP, values=values, where=where)


def parallelism_from_launch(values: Mapping[str, Any], where: Callable[[str], str] = str
                            ) -> ParallelismConfig:
    """The ``ParallelismConfig`` of ``accel launch``'s ``parallelism_config_*`` settings.

    Example:
        >>> config = parallelism_from_launch({"parallelism_config_dp_replicate_size": "2"})
        >>> config.dp_replicate_size, config.dp_shard_size, config.tp_size
        (2, None, 1)
    """
    sizes = {}
    for name, value in values.items():
        text = str(value).strip()
        if name not in LAUNCH_PARALLELISM:
            raise ValueError(f"unknown parallelism setting {name!r}; expected some of "
                             f"{', '.join(LAUNCH_PARALLELISM)}")
        if isinstance(value, bool) or not text.isdigit():
            raise ValueError(f"{where(name)} {value!r}: expected a positive integer")
        sizes[name] = int(text)
    return _build(ParallelismConfig, fields=LAUNCH_PARALLELISM, values=sizes, where=where)


def _build(cls: Callable[..., _T], *, fields: Mapping[str, str], values: Mapping[str, Any],
           where: Callable[[str], str]) -> _T:
    """``cls(**values)`` under its field names; a bad value is blamed on its own setting (each
    is tried alone first, quietly), a contradiction on all of them."""
    for name, value in values.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _blame(cls, {fields[name]: value}, f"{where(name)} {value!r}")
    given = ", ".join(f"{where(name)} {value!r}" for name, value in values.items())
    return _blame(cls, {fields[name]: value for name, value in values.items()}, given)


def _blame(cls: Callable[..., _T], kwargs: dict[str, Any], what: str) -> _T:
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{what}: {exc}") from None
