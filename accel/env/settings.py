"""The one table of ``ACCEL_*`` variables: what each means, who reads it, how it is parsed.

``accel launch`` resolves its settings (flag > environment > config file > default) and exports
them to its workers; ``Accelerator()`` in each worker reads them back with ``read_settings``.
Both sides go through ``ACCEL_TABLE``: the launcher asks ``launch_setting_source`` which
variable sets a launch setting, the worker side parses each variable into an ``EnvSettings``
field, and ``settings_environment`` is the inverse of ``read_settings``.

Example:
    >>> read_settings({"ACCEL_DEVICE": "cpu", "ACCEL_DEBUG": "1"}).debug
    True
    >>> settings_environment(EnvSettings(device="cpu", launched=True))
    {'ACCEL_DEVICE': 'cpu', 'ACCEL_LAUNCHED': '1'}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from .._base.parse import is_true, parse_bool, parse_choice
from ._base import LaunchEnvironmentError, current, optional_int, seconds_variable

__all__ = [
    "ACCEL_TABLE",
    "ACCEL_VARIABLES",
    "DYNAMO_BACKENDS",
    "DYNAMO_MODES",
    "FSDP_VARIABLES",
    "AccelVariable",
    "EnvSettings",
    "launch_setting_source",
    "read_settings",
    "settings_environment",
    "sync_batchnorm_mode",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class EnvSettings:
    """Settings passed to workers by ``accel launch`` through ``ACCEL_*`` variables."""

    device: str | None = None
    mixed_precision: str | None = None
    gradient_accumulation_steps: int | None = None
    debug: bool = False
    timeout: float | None = None
    stall_seconds: float | None = None
    config_file: str | None = None
    launched: bool = False
    num_threads: int | None = None
    #: ``torch.compile`` settings, Accelerate's ``dynamo_*`` names (``accel launch
    #: --dynamo_backend ...``): the defaults of ``TorchDynamoPlugin`` fields left unset.
    dynamo_backend: str | None = None
    dynamo_mode: str | None = None
    dynamo_use_fullgraph: bool = False
    #: None (unset): torch.compile's own default (``dynamic=None``, dynamic after a recompile)
    dynamo_use_dynamic: bool | None = None
    dynamo_use_regional_compilation: bool = False
    #: ``init_empty_weights()`` / ``init_on_device()`` put buffers on the device too when their
    #: ``include_buffers`` is left unset (Accelerate's ``ACCELERATE_INIT_INCLUDE_BUFFERS``).
    init_include_buffers: bool = False
    #: FSDP (``accel launch --use_fsdp --fsdp_* ...``): ``Accelerator()`` builds its
    #: ``FullyShardedDataParallelPlugin`` from the ``fsdp_*`` values (as written, validated by
    #: the launcher and again by the plugin) and its ``ParallelismConfig`` from the sizes.
    use_fsdp: bool = False
    fsdp_version: str | None = None
    fsdp_sharding_strategy: str | None = None
    fsdp_reshard_after_forward: str | None = None
    fsdp_offload_params: str | None = None
    fsdp_auto_wrap_policy: str | None = None
    fsdp_transformer_layer_cls_to_wrap: str | None = None
    fsdp_min_num_params: str | None = None
    fsdp_backward_prefetch: str | None = None
    fsdp_state_dict_type: str | None = None
    fsdp_forward_prefetch: str | None = None
    fsdp_use_orig_params: str | None = None
    fsdp_cpu_ram_efficient_loading: str | None = None
    fsdp_sync_module_states: str | None = None
    fsdp_activation_checkpointing: str | None = None
    fsdp_activation_checkpointing_offload: str | None = None
    fsdp_ignored_modules: str | None = None
    parallelism_config_dp_replicate_size: int | None = None
    parallelism_config_dp_shard_size: int | None = None
    #: SyncBatchNorm mode for prepare(): "global", "node" or "off" (None: unset)
    sync_batchnorm: str | None = None
    #: where ``hvd.elastic`` state commits are kept so that restarted workers find them
    #: (None: ``<temp dir>/accel-elastic-<user>``).
    elastic_dir: str | None = None

    def given(self, prefix: str) -> dict[str, Any]:
        """The fields named ``prefix...`` that are set (``"fsdp_"``: the FSDP plugin's).

        Example:
            >>> EnvSettings(use_fsdp=True, fsdp_version="2").given("fsdp_")
            {'fsdp_version': '2'}
        """
        found = {f.name: getattr(self, f.name) for f in fields(self) if f.name.startswith(prefix)}
        return {name: value for name, value in found.items() if value is not None}


#: Accelerate's ``DynamoBackend`` values, lower-cased (``no``: do not compile).
DYNAMO_BACKENDS = ("no", "eager", "aot_eager", "inductor", "aot_ts_nvfuser", "nvprims_nvfuser",
                   "cudagraphs", "ofi", "fx2trt", "onnxrt", "tensorrt",
                   "aot_torchxla_trace_once", "torchxla_trace_once", "tvm", "hpu_backend",
                   "neuron")
#: ``torch.compile`` modes (Accelerate offers the first three).
DYNAMO_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


#: FSDP launch settings (Accelerate's flag names) and what they set: ``ACCEL_<NAME>``.
FSDP_VARIABLES: tuple[tuple[str, str], ...] = (
    ("fsdp_version", "1 or 2 (accel always runs FSDP2; 1 maps FSDP1 settings)"),
    ("fsdp_sharding_strategy", "FSDP1's FULL_SHARD | SHARD_GRAD_OP | HYBRID_SHARD | "
     "HYBRID_SHARD_ZERO2 (or 1-5), mapped to reshard_after_forward"),
    ("fsdp_reshard_after_forward", "true | false (or an FSDP1 sharding strategy)"),
    ("fsdp_offload_params", "true to keep parameters, gradients and optimizer states on the CPU"),
    ("fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP | SIZE_BASED_WRAP | NO_WRAP"),
    ("fsdp_transformer_layer_cls_to_wrap", "comma-separated class names to shard as units"),
    ("fsdp_min_num_params", "parameters of a unit with SIZE_BASED_WRAP"),
    ("fsdp_backward_prefetch", "FSDP1's BACKWARD_PRE | BACKWARD_POST | NO_PREFETCH (FSDP2 "
     "always prefetches)"),
    ("fsdp_state_dict_type", "SHARDED_STATE_DICT | FULL_STATE_DICT (what save_state writes)"),
    ("fsdp_forward_prefetch", "FSDP1's; only false is accepted"),
    ("fsdp_use_orig_params", "FSDP1's; FSDP2 always trains the original parameters"),
    ("fsdp_cpu_ram_efficient_loading", "true: rank 0 holds the weights, prepare() sends the "
     "shards"),
    ("fsdp_sync_module_states", "true: start every rank from rank 0's weights"),
    ("fsdp_activation_checkpointing", "true to recompute each unit's activations in backward"),
    ("fsdp_activation_checkpointing_offload", "only false is accepted"),
    ("fsdp_ignored_modules", "regex of module names that are not sharded"),
)


def _text(environ: Mapping[str, str], name: str) -> str | None:
    return environ.get(name) or None


def _positive(environ: Mapping[str, str], name: str) -> int | None:
    return optional_int(environ, name, minimum=1)


def _truthy(environ: Mapping[str, str], name: str) -> bool:
    return is_true(environ.get(name, ""))


def _one(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name, "") == "1"


def _switch(environ: Mapping[str, str], name: str) -> bool:
    """A validated boolean (1/0, true/false, yes/no, on/off); unset or empty is False."""
    try:
        return parse_bool(environ.get(name, ""), name=name, empty=False)
    except ValueError as exc:
        raise LaunchEnvironmentError(f"{exc}; unset it or fix the launcher") from None


def _maybe_switch(environ: Mapping[str, str], name: str) -> bool | None:
    """A validated boolean, or None when unset or empty (the consumer's own default applies)."""
    if environ.get(name, "").strip() == "":
        return None
    return _switch(environ, name)


def sync_batchnorm_mode(raw: str, name: str = "ACCEL_SYNC_BATCHNORM") -> str | None:
    """``global`` | ``node`` (``local`` is an alias) | a boolean (true: ``global``, false:
    ``off``); None when empty.

    Example:
        >>> sync_batchnorm_mode("Local"), sync_batchnorm_mode("0"), sync_batchnorm_mode("")
        ('node', 'off', None)
    """
    text = str(raw).strip().lower()
    if text in ("", "global", "node"):
        return text or None
    if text == "local":
        return "node"
    try:
        return "global" if parse_bool(text, name=name, empty=False) else "off"
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a SyncBatchNorm mode; use global, node or "
                         "false") from None


def _sync_batchnorm(environ: Mapping[str, str], name: str) -> str | None:
    try:
        return sync_batchnorm_mode(environ.get(name, ""), name)
    except ValueError as exc:
        raise LaunchEnvironmentError(f"{exc} (or unset it)") from None


def _choice(choices: tuple[str, ...], what: str) -> Callable[[Mapping[str, str], str], str | None]:
    def read(environ: Mapping[str, str], name: str) -> str | None:
        raw = environ.get(name, "")
        if raw.strip() == "":
            return None
        try:
            return parse_choice(raw, name=name, choices=choices, what=what)
        except ValueError as exc:
            raise LaunchEnvironmentError(str(exc)) from None
    return read


@dataclass(frozen=True, kw_only=True, slots=True)
class AccelVariable:
    """One ``ACCEL_*`` variable.

    Attributes:
        name: the variable.
        description: one line for README and ``accel env``.
        field: the ``EnvSettings`` field it fills in a worker (None: read elsewhere).
        read: parses the variable from an environment mapping (worker side).
        launch_setting: the ``accel launch`` setting it is a source for (None: not one).
        fallbacks: non-``ACCEL_*`` variables the launcher reads for that setting after it.
        documented: part of the public table (README); False for launcher-to-worker plumbing.
    """

    name: str
    description: str
    field: str | None = None
    read: Callable[[Mapping[str, str], str], Any] | None = None
    launch_setting: str | None = None
    fallbacks: tuple[str, ...] = ()
    documented: bool = True


ACCEL_TABLE: tuple[AccelVariable, ...] = (
    AccelVariable(name="ACCEL_DEVICE",
                  description="device kind for every worker: cpu | cuda | xla | mps",
                  field="device", read=_text, launch_setting="device"),
    AccelVariable(name="ACCEL_MIXED_PRECISION", description="no | fp16 | bf16",
                  field="mixed_precision", read=_text, launch_setting="mixed_precision"),
    AccelVariable(name="ACCEL_GRADIENT_ACCUMULATION_STEPS", description="integer >= 1",
                  field="gradient_accumulation_steps", read=_positive,
                  launch_setting="gradient_accumulation_steps"),
    AccelVariable(name="ACCEL_DEBUG",
                  description="1 to check op/shape/dtype across ranks before every collective",
                  field="debug", read=_truthy, launch_setting="debug"),
    AccelVariable(name="ACCEL_TIMEOUT", description="collective timeout in seconds",
                  field="timeout", read=seconds_variable),
    AccelVariable(name="ACCEL_STALL_SECONDS",
                  description="seconds a collective may wait before a stall report is printed",
                  field="stall_seconds", read=seconds_variable),
    AccelVariable(name="ACCEL_CONFIG_FILE",
                  description="path of the YAML config file used by `accel launch` / "
                  "`accel config`", field="config_file", read=_text),
    AccelVariable(name="ACCEL_LAUNCHED", description="set to 1 by `accel launch` (informational)",
                  field="launched", read=_one),
    AccelVariable(name="ACCEL_NUM_THREADS",
                  description="torch intra-op threads per worker (applied by Accelerator())",
                  field="num_threads", read=_positive, launch_setting="num_cpu_threads_per_process",
                  fallbacks=("OMP_NUM_THREADS",)),
    AccelVariable(name="ACCEL_DYNAMO_BACKEND",
                  description="torch.compile backend, Accelerate's names lower-cased "
                  "(no, eager, aot_eager, inductor, cudagraphs, ...); Accelerator() compiles "
                  "prepared models with it", field="dynamo_backend",
                  read=_choice(DYNAMO_BACKENDS, "a dynamo backend"),
                  launch_setting="dynamo_backend"),
    AccelVariable(name="ACCEL_DYNAMO_MODE",
                  description="torch.compile mode: default, reduce-overhead, "
                  "max-autotune or max-autotune-no-cudagraphs", field="dynamo_mode",
                  read=_choice(DYNAMO_MODES, "a torch.compile mode"), launch_setting="dynamo_mode"),
    AccelVariable(name="ACCEL_DYNAMO_USE_FULLGRAPH",
                  description="1 to compile the whole model as one graph "
                  "(torch.compile fullgraph=True)", field="dynamo_use_fullgraph", read=_switch,
                  launch_setting="dynamo_use_fullgraph"),
    AccelVariable(name="ACCEL_DYNAMO_USE_DYNAMIC",
                  description="1 to trace dynamic shapes (torch.compile "
                  "dynamic=True; 0: dynamic=False; unset: torch's default)",
                  field="dynamo_use_dynamic", read=_maybe_switch,
                  launch_setting="dynamo_use_dynamic"),
    AccelVariable(name="ACCEL_DYNAMO_USE_REGIONAL_COMPILATION",
                  description="1 to compile repeated blocks once each (regional compilation)",
                  field="dynamo_use_regional_compilation", read=_switch,
                  launch_setting="dynamo_use_regional_compilation"),
    AccelVariable(name="ACCEL_INIT_INCLUDE_BUFFERS",
                  description="1 to create buffers on the meta device too "
                  "under init_empty_weights() / init_on_device() when include_buffers is not "
                  "given", field="init_include_buffers", read=_switch),
    AccelVariable(name="ACCEL_USE_FSDP",
                  description="1 to shard models with FSDP2 (accel launch --use_fsdp); "
                  "Accelerator() builds its fsdp_plugin from the FSDP variables below",
                  field="use_fsdp", read=_switch, launch_setting="use_fsdp"),
    *(AccelVariable(name=f"ACCEL_{name.upper()}",
                    description=f"FullyShardedDataParallelPlugin: {text} (accel "
                    f"launch --{name})", field=name, read=_text,
                    launch_setting=name) for name, text in FSDP_VARIABLES),
    *(AccelVariable(name=f"ACCEL_PARALLELISM_CONFIG_{name.upper()}",
                    description=f"ParallelismConfig {name}: "
                    f"{text} (accel launch --parallelism_config_{name})",
                    field=f"parallelism_config_{name}", read=_positive,
                    launch_setting=f"parallelism_config_{name}")
      for name, text in (("dp_replicate_size", "replicated groups (HSDP)"),
                         ("dp_shard_size", "processes that shard the model in each group"))),
    AccelVariable(name="ACCEL_SYNC_BATCHNORM",
                  description="global | node | false: prepare() turns BatchNorm "
                  "layers into SyncBatchNorm over all processes or over each machine's "
                  "(Accelerator(sync_batchnorm=...))", field="sync_batchnorm", read=_sync_batchnorm,
                  launch_setting="sync_batchnorm"),
    AccelVariable(name="ACCEL_ELASTIC_DIR",
                  description="directory where hvd.elastic commits are kept for "
                  "restarted workers; shared storage survives a lost machine (default: <temp "
                  "dir>/accel-elastic-<user>)", field="elastic_dir", read=_text),
    AccelVariable(name="ACCEL_LOG_LEVEL",
                  description="level for accel.get_logger loggers (DEBUG/INFO/WARNING/"
                  "ERROR/CRITICAL)"),  # read by accel.env.log_level
    # What `accel launch` on this machine was asked for: the bootstrap compares it with the
    # world torchrun formed (machines started with different -n).
    AccelVariable(name="ACCEL_NUM_PROCESSES",
                  description="processes requested on all machines (internal)", documented=False),
    AccelVariable(name="ACCEL_NUM_MACHINES", description="machines requested (internal)",
                  documented=False),
    AccelVariable(name="ACCEL_AGENT_PID",
                  description="pid of the launcher's agent; workers die with it (internal)",
                  documented=False),
    AccelVariable(name="ACCEL_PS_LAYOUT",
                  description="parameter-server roles from `accel launch --server_num/"
                  "--worker_num`: servers:workers per machine, read by accel.ps and "
                  "detect_launch (internal)", documented=False),
    AccelVariable(name="ACCEL_RANK_LOG_DIR",
                  description="`accel launch --log_dir`: where each worker links "
                  "its log files as workerlog.<rank> (internal)", documented=False),
)

#: Variables ``accel launch`` sets for its workers, and what they mean. Documented in README.
ACCEL_VARIABLES: dict[str, str] = {var.name: var.description for var in ACCEL_TABLE
                                   if var.documented}

def read_settings(environ: Mapping[str, str] | None = None) -> EnvSettings:
    """Read the ``ACCEL_*`` settings that ``accel launch`` passes to its workers.

    Empty variables count as unset.

    Raises:
        LaunchEnvironmentError: a variable holds a value of the wrong kind, naming it.
    """
    env = current(environ)
    values = {var.field: var.read(env, var.name) for var in ACCEL_TABLE
              if var.field is not None and var.read is not None}
    return EnvSettings(**values)


def settings_environment(settings: EnvSettings) -> dict[str, str]:
    """The ``ACCEL_*`` variables that make ``read_settings`` return ``settings``.

    Fields at their default (None, or False where that is the default) are left out; True is
    written as ``1``, a False that is not the default (``dynamo_use_dynamic``) as ``0``.
    """
    defaults = EnvSettings()
    out: dict[str, str] = {}
    for var in ACCEL_TABLE:
        value = getattr(settings, var.field) if var.field else None
        if value is None or (var.field and value == getattr(defaults, var.field)):
            continue
        out[var.name] = ("1" if value else "0") if isinstance(value, bool) else str(value)
    return out


def launch_setting_source(setting: str, environ: Mapping[str, str] | None = None
                          ) -> tuple[str, str] | None:
    """``(variable, raw value)`` of the first non-empty variable that sets a launch setting.

    Example:
        >>> launch_setting_source("num_cpu_threads_per_process", {"OMP_NUM_THREADS": "4"})
        ('OMP_NUM_THREADS', '4')
    """
    env = current(environ)
    for var in ACCEL_TABLE:
        if var.launch_setting != setting:
            continue
        for name in (var.name, *var.fallbacks):
            if env.get(name, "") != "":
                return name, env[name]
    return None
