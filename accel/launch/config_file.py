"""The YAML config file of ``accel launch`` / ``accel config`` (Accelerate-compatible keys).

Where it lives: ``$ACCEL_CONFIG_FILE`` if set, else ``$XDG_CONFIG_HOME/accel/default_config.yaml``,
else ``~/.config/accel/default_config.yaml``. Files are read with ``yaml.safe_load`` only (no
Python tags, no code), and PyYAML is imported lazily (pip extra ``yaml``).

A file written by ``accelerate config`` is accepted: the keys accel understands are mapped to
launch settings, boiler-plate keys at their neutral values are accepted silently, and every other
key is reported in one warning.

Example:
    >>> cfg = parse_config({"distributed_type": "MULTI_CPU", "num_processes": 4}, "cfg.yaml")
    >>> cfg.values["device"], cfg.values["num_processes"], cfg.ignored
    ('cpu', 4, [])
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._base.optional import require
from ..env import config_file_variable, config_home
from .errors import CLIError
from .sharding import FSDP_SETTINGS, PARALLELISM_SETTINGS

__all__ = [
    "ConfigFile",
    "config_to_yaml_dict",
    "default_config_path",
    "load_yaml",
    "parse_config",
    "read_config",
    "user_config_path",
    "write_config",
]

FILE_NAME = "default_config.yaml"

#: Keys whose value is used as-is (after validation by the settings resolver).
_DIRECT_KEYS = (
    "num_processes", "num_machines", "machine_rank", "main_process_ip", "main_process_port",
    "mixed_precision", "gpu_ids", "gradient_accumulation_steps", "num_cpu_threads_per_process",
    "max_restarts", "monitor_interval", "rdzv_backend", "rdzv_conf", "debug", "tee", "log_dir",
    "enable_cpu_affinity", "same_network", "dynamo_backend",  # dynamo_backend: pre-0.16 files
    "sync_batchnorm",
)

#: Nested blocks whose keys are launch settings: block -> (key prefix, keys used).
_NESTED: dict[str, tuple[str, tuple[str, ...]]] = {
    "dynamo_config": ("dynamo_", ("dynamo_backend", "dynamo_mode", "dynamo_use_fullgraph",
                                  "dynamo_use_dynamic", "dynamo_use_regional_compilation")),
    "mpirun_config": ("mpirun_", ("mpirun_hostfile",)),
}
#: The blocks of ``distributed_type: FSDP`` (used only with it): their keys are launch settings.
_FSDP_BLOCKS: dict[str, tuple[str, tuple[str, ...]]] = {
    "fsdp_config": ("fsdp_", FSDP_SETTINGS),
    "parallelism_config": ("parallelism_config_", PARALLELISM_SETTINGS),
}

#: Accelerate boiler-plate: accepted silently while it has one of these (neutral) values.
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "compute_environment": ("LOCAL_MACHINE",),
    "downcast_bf16": ("no", False, None),
    "main_training_function": ("main", None),
    "use_mps_device": (False, None),
    "tpu_env": ([], None),
    "tpu_use_cluster": (False, None),
    "tpu_use_sudo": (False, None),
    "tpu_name": (None,),
    "tpu_zone": (None,),
    "commands": (None,),
    "command_file": (None,),
    "deepspeed_config": ({}, None),
    "fsdp_config": ({}, None),
    "parallelism_config": ({}, None),
    "megatron_lm_config": ({}, None),
    "ipex_config": ({}, None),
}

# TPU: what Accelerate before 0.28 wrote for XLA.
_DISTRIBUTED_TYPES: dict[str, str | None] = {
    "NO": None, "MULTI_CPU": "cpu", "MULTI_GPU": "cuda", "XLA": "xla", "MULTI_XLA": "xla",
    "TPU": "xla", "DEEPSPEED": "cuda", "MEGATRON_LM": "cuda",
    "FSDP": None,  # FSDP2 on the detected device (CUDA if visible, else CPU; use_cpu: CPU)
}
_DDP_INSTEAD = ("to train with DDP instead (every process holds the whole model), pass --multi_gpu "
                "(or --cpu), or set distributed_type: MULTI_GPU")
#: Types a config file may name (it loads) but that `accel launch` refuses, and why.
_REFUSED_TYPES: dict[str, str] = {
    "DEEPSPEED": "accel has no DeepSpeed integration",
    "MEGATRON_LM": "accel has no Megatron-LM integration",
}
#: The block each refused type brings; it is explained by the refusal, not listed as ignored.
_REFUSED_BLOCKS = {"DEEPSPEED": "deepspeed_config",
                   "MEGATRON_LM": "megatron_lm_config"}


@dataclass(frozen=True, kw_only=True, slots=True)
class ConfigFile:
    """A parsed config file: launch settings it sets, and the keys it ignores."""

    path: str
    values: dict[str, Any] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)
    #: Why ``accel launch`` cannot run what the file asks for (e.g. ``distributed_type: FSDP``)
    #: unless a device flag (``--multi_gpu``, ``--cpu``, ``--tpu``) overrides it; None: it can.
    unsupported: str | None = None


def user_config_path(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME/accel/default_config.yaml`` or ``~/.config/accel/default_config.yaml``."""
    base = config_home(environ) or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "accel" / FILE_NAME


def default_config_path(environ: Mapping[str, str] | None = None) -> tuple[Path, str]:
    """The config path to use when none is given, and why: ``env ACCEL_CONFIG_FILE`` or default.

    Example:
        >>> default_config_path({"ACCEL_CONFIG_FILE": "/tmp/a.yaml"})
        (PosixPath('/tmp/a.yaml'), 'env ACCEL_CONFIG_FILE')
    """
    explicit = config_file_variable(environ)
    if explicit:
        return Path(explicit).expanduser(), "env ACCEL_CONFIG_FILE"
    return user_config_path(environ), "default location"


def load_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a YAML mapping with ``yaml.safe_load``; every problem is a one-line ``CLIError``."""
    yaml = require("yaml", "yaml")
    name = os.fspath(path)
    try:
        with open(name, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except FileNotFoundError:
        raise CLIError(f"config file {name} does not exist; pass an existing file or create one "
                       "with `accel config`") from None
    except IsADirectoryError:
        raise CLIError(f"config file {name} is a directory; expected a YAML file") from None
    except UnicodeDecodeError as exc:
        raise CLIError(f"config file {name} is not UTF-8 text (byte {exc.start}: "
                       f"{exc.reason}); expected a YAML file") from None
    except OSError as exc:  # permission denied, I/O error, ...
        raise CLIError(f"config file {name} cannot be read: {exc.strerror or exc}") from None
    except yaml.constructor.ConstructorError as exc:
        raise CLIError(
            f"config file {name} uses a YAML tag that is not allowed ({exc.problem}); accel reads "
            "configs with yaml.safe_load, which builds plain data only (maps, lists, strings, "
            "numbers, booleans): remove the tag"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise CLIError(f"config file {name} is not valid YAML: {problem}{where}; fix it or "
                       "write a new one with `accel config`") from None
    if not isinstance(data, dict):
        found = "empty" if data is None else f"a {type(data).__name__}"
        raise CLIError(f"config file {name} is {found}; expected a mapping of settings such as "
                       "`num_processes: 2`")
    return data


def _neutral(key: str, value: Any) -> bool:
    return key in _NEUTRAL and any(value == ok and type(value) is type(ok) or value is ok
                                   for ok in _NEUTRAL[key])


def _distributed_type(raw: Mapping[str, Any]) -> Any:
    """``distributed_type`` as written; YAML 1.1 reads an unquoted ``NO`` as false."""
    value = raw.get("distributed_type")
    return "NO" if value is False else value


def _device_of(raw: Mapping[str, Any], path: str) -> tuple[str | None, bool]:
    """(device kind or None, single-process) from ``use_cpu`` / ``distributed_type``."""
    dist_type = _distributed_type(raw)
    single = False
    device: str | None = None
    if dist_type is not None:
        key = str(dist_type).upper()
        if key not in _DISTRIBUTED_TYPES:
            raise CLIError(
                f"config file {path}: distributed_type {dist_type!r} is not supported by accel; "
                f"expected one of {', '.join(_DISTRIBUTED_TYPES)} (DDP on CPU/GPU, FSDP, or XLA)"
            )
        device = _DISTRIBUTED_TYPES[key]
        single = key == "NO"
    use_cpu = raw.get("use_cpu")
    if use_cpu not in (None, True, False):
        raise CLIError(f"config file {path}: use_cpu must be true or false, got {use_cpu!r}")
    if use_cpu:
        device = "cpu"
    return device, single


def parse_config(raw: Mapping[str, Any], path: str) -> ConfigFile:
    """Map an (Accelerate-style) config mapping to launch settings."""
    values: dict[str, Any] = {}
    ignored: list[str] = []
    dist_type = str(_distributed_type(raw) or "").upper()
    for key, value in raw.items():
        if key in _DIRECT_KEYS:
            if value is not None:
                values[key] = value
        elif key in _NESTED and isinstance(value, Mapping):
            ignored += _nested(_NESTED[key], block=key, items=value, values=values)
        elif key in _FSDP_BLOCKS and dist_type == "FSDP" and isinstance(value, Mapping):
            ignored += _nested(_FSDP_BLOCKS[key], block=key, items=value, values=values)
        elif key not in ("distributed_type", "use_cpu") and not _neutral(key, value) and \
                _REFUSED_BLOCKS.get(dist_type) != key:
            ignored.append(str(key))
    unsupported = None
    if dist_type in _REFUSED_TYPES:
        unsupported = (f"config file {path}: distributed_type {dist_type}: "
                       f"{_REFUSED_TYPES[dist_type]}; {_DDP_INSTEAD}")
    device, single = _device_of(raw, path)
    if dist_type == "FSDP":
        values["use_fsdp"] = True
    if device is not None:
        values["device"] = device
    if single and "num_processes" not in values:
        values["num_processes"] = 1
    if values.get("mixed_precision") is False:  # YAML 1.1 reads an unquoted `no` as false
        values["mixed_precision"] = "no"
    if str(values.get("gpu_ids", "")).lower() == "all":
        del values["gpu_ids"]
    elif isinstance(values.get("gpu_ids"), (list, tuple)):
        values["gpu_ids"] = ",".join(str(item) for item in values["gpu_ids"])
    return ConfigFile(path=path, values=values, ignored=sorted(ignored), raw=dict(raw),
                      unsupported=unsupported)


def _nested(spec: tuple[str, tuple[str, ...]], *, block: str, items: Mapping[str, Any],
            values: dict[str, Any]) -> list[str]:
    """Copy a block's known keys (``dynamo_config: {backend: ...}`` is ``dynamo_backend``) into
    ``values``; returns the keys it does not know, as ``block.key``."""
    prefix, known = spec
    unknown = []
    for key, value in items.items():
        name = str(key) if str(key).startswith(prefix) else prefix + str(key)
        if name not in known:
            unknown.append(f"{block}.{key}")
        elif value is not None:
            values[name] = value
    return unknown


def read_config(path: str | os.PathLike[str]) -> ConfigFile:
    """Load and parse a config file.

    Raises:
        CLIError: missing file, invalid YAML, Python tags, unsupported ``distributed_type``.
    """
    name = os.fspath(path)
    return parse_config(load_yaml(name), name)


def config_to_yaml_dict(
    *, num_machines: int, machine_rank: int, main_process_ip: str | None,
    main_process_port: int | None, use_cpu: bool, num_processes: int, gpu_ids: str | None,
    mixed_precision: str, fsdp: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The mapping ``accel config`` writes (Accelerate's key names, so both tools read it);
    ``fsdp``: an ``fsdp_config`` block, for ``distributed_type: FSDP``."""
    out: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": ("MULTI_CPU" if use_cpu else "MULTI_GPU") if num_processes > 1
        else "NO",
        "mixed_precision": mixed_precision,
        "num_machines": num_machines,
        "machine_rank": machine_rank,
        "num_processes": num_processes,
        "gpu_ids": gpu_ids or "all",
        "use_cpu": use_cpu,
    }
    if num_machines > 1:
        out["main_process_ip"] = main_process_ip
        out["main_process_port"] = main_process_port
    if fsdp is not None:
        out["distributed_type"], out["fsdp_config"] = "FSDP", dict(fsdp)
    return out


def write_config(path: str | os.PathLike[str], data: Mapping[str, Any]) -> Path:
    """Write ``data`` as YAML (creating parent directories); returns the path written."""
    yaml = require("yaml", "yaml")
    target = Path(path).expanduser()
    tmp = target.with_name(target.name + ".tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as fh:
            yaml.safe_dump(dict(data), fh, sort_keys=False, default_flow_style=False)
        os.replace(tmp, target)
    except OSError as exc:
        where = exc.filename or target
        raise CLIError(f"cannot write config file {target}: {exc.strerror or exc} ({where}); "
                       "pass a writable path with --config_file") from None
    return target
