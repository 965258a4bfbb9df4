"""Accelerate's ``accelerate.commands.config.config_args``: the config file as dataclasses.

``ClusterConfig`` is the file that ``accelerate config`` writes for one or more machines (and
that ``accel config`` writes, with the same keys): it loads from YAML or JSON and saves back,
and a key it does not know is an error naming it, as in Accelerate. ``accel launch
--config_file`` reads the same files (:mod:`accel.launch.config_file`); these classes are for
scripts and tools that read or edit a config file themselves. Amazon SageMaker files
(``compute_environment: AMAZON_SAGEMAKER``) are refused: accel does not submit SageMaker jobs.

Example:
    >>> config = ClusterConfig(compute_environment="LOCAL_MACHINE", distributed_type="MULTI_CPU",
    ...                        mixed_precision="no", use_cpu=True, debug=False, num_processes=2)
    >>> config.to_dict()["num_processes"], config.fsdp_config
    (2, {})
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from enum import Enum
from typing import Any, TypeVar

__all__ = ["COMPUTE_ENVIRONMENTS", "DISTRIBUTED_TYPES", "BaseConfig", "ClusterConfig",
           "load_config_from_file"]

#: ``compute_environment`` values: Accelerate's; accel reads ``LOCAL_MACHINE`` files only.
COMPUTE_ENVIRONMENTS = ("LOCAL_MACHINE", "AMAZON_SAGEMAKER")
#: ``distributed_type`` values a file may name (Accelerate's ``DistributedType`` members;
#: ``accel launch`` refuses DEEPSPEED and MEGATRON_LM when it runs the file, not when it loads).
DISTRIBUTED_TYPES = ("NO", "MULTI_CPU", "MULTI_GPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA",
                     "MULTI_MUSA", "MULTI_XPU", "MULTI_HPU", "MULTI_NEURON", "DEEPSPEED", "FSDP",
                     "XLA", "MEGATRON_LM")
_SAGEMAKER = ("accel does not submit Amazon SageMaker jobs (compute_environment: "
              "AMAZON_SAGEMAKER); run `accel launch` inside the job with a LOCAL_MACHINE config")

_Config = TypeVar("_Config", bound="BaseConfig")


def _plain(value: Any) -> Any:
    """A value as the file holds it: enum members as their values, empty blocks as absent."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()} or None
    return value


def _choice(value: Any, *, key: str, choices: tuple[str, ...]) -> str:
    text = "NO" if value is False else str(getattr(value, "value", value))  # YAML 1.1: NO is false
    if text.upper() not in choices:
        raise ValueError(f"{key} {value!r} is not one of {', '.join(choices)}; fix the config "
                         "file")
    return text.upper()


@dataclass
class BaseConfig:
    """The keys every config file has (Accelerate's ``BaseConfig``); ``compute_environment``
    and ``distributed_type`` are kept as their upper-case names (strings, so they compare equal
    to ``DistributedType`` members)."""

    compute_environment: str
    distributed_type: str
    mixed_precision: str
    use_cpu: bool
    debug: bool

    def __post_init__(self) -> None:
        self.compute_environment = _choice(self.compute_environment, key="compute_environment",
                                           choices=COMPUTE_ENVIRONMENTS)
        if self.compute_environment != "LOCAL_MACHINE":
            raise ValueError(_SAGEMAKER)
        self.distributed_type = _choice(self.distributed_type, key="distributed_type",
                                        choices=DISTRIBUTED_TYPES)
        precision: Any = self.mixed_precision
        if precision is False:  # YAML 1.1 reads an unquoted `no` as false
            self.mixed_precision = "no"
        if getattr(self, "dynamo_config", None) is None:
            setattr(self, "dynamo_config", {})  # noqa: B010 (a field of the subclasses only)

    def to_dict(self) -> dict[str, Any]:
        """The keys to write: enum members as values, ``None`` and empty blocks left out."""
        found = {item.name: _plain(getattr(self, item.name)) for item in fields(self)}
        return {key: value for key, value in found.items() if value is not None}

    @staticmethod
    def process_config(config_dict: dict[str, Any]) -> dict[str, Any]:
        """Fill the keys older files lack and move renamed ones (``fp16``, ``dynamo_backend``)
        to their current place, as Accelerate does.

        Raises:
            ValueError: the file names no ``distributed_type``.
        """
        config = dict(config_dict)
        config.setdefault("compute_environment", "LOCAL_MACHINE")
        if "distributed_type" not in config:
            raise ValueError("a config file needs a `distributed_type` (e.g. NO, MULTI_CPU, "
                             "MULTI_GPU, FSDP); add one, or write the file with `accel config`")
        if "num_processes" not in config and config["distributed_type"] in ("NO", False):
            config["num_processes"] = 1
        fp16 = config.pop("fp16", None)
        config.setdefault("mixed_precision", "fp16" if fp16 else None)
        if "dynamo_backend" in config:
            backend = config.pop("dynamo_backend")
            config["dynamo_config"] = {} if str(backend).upper() == "NO" else \
                {"dynamo_backend": backend}
        for key in ("use_cpu", "debug", "enable_cpu_affinity"):
            config.setdefault(key, False)
        return config

    @classmethod
    def _from_mapping(cls: type[_Config], data: Any, path: str) -> _Config:
        if not isinstance(data, dict):
            raise ValueError(f"the config file at {path} holds no mapping of settings; write "
                             "one with `accel config`")
        config = cls.process_config(data)
        known = {item.name for item in fields(cls)}
        extra = sorted(set(config) - known)
        if extra:
            raise ValueError(f"The config file at {path} had unknown keys ({extra}): remove "
                             "them, or rewrite the file with `accel config`")
        return cls(**config)

    @classmethod
    def from_json_file(cls: type[_Config], json_file: str | os.PathLike[str] | None = None,
                       ) -> _Config:
        """Load a JSON config file (default: ``accel launch``'s default config path)."""
        path = _path(json_file)
        with open(path, encoding="utf-8") as fh:
            return cls._from_mapping(json.load(fh), path)

    def to_json_file(self, json_file: str | os.PathLike[str]) -> None:
        """Write the config as JSON (sorted keys)."""
        with open(json_file, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def from_yaml_file(cls: type[_Config], yaml_file: str | os.PathLike[str] | None = None,
                       ) -> _Config:
        """Load a YAML config file (read with ``yaml.safe_load``; default: ``accel launch``'s
        default config path)."""
        path = _path(yaml_file)
        return cls._from_mapping(_read_yaml(path), path)

    def to_yaml_file(self, yaml_file: str | os.PathLike[str]) -> None:
        """Write the config as YAML (``yaml.safe_dump``)."""
        # launch/ is the side layer: imported lazily (tests/unit/test_architecture.py)
        from ..launch.config_file import write_config

        write_config(yaml_file, self.to_dict())


@dataclass
class ClusterConfig(BaseConfig):
    """A config file for one or more machines (Accelerate's ``ClusterConfig``; the blocks
    default to empty mappings)."""

    num_processes: int = -1
    machine_rank: int = 0
    num_machines: int = 1
    gpu_ids: str | None = None
    main_process_ip: str | None = None
    main_process_port: int | None = None
    rdzv_backend: str | None = "static"
    same_network: bool | None = False
    main_training_function: str = "main"
    enable_cpu_affinity: bool = False
    fp8_config: dict[str, Any] | None = None
    deepspeed_config: dict[str, Any] | None = None
    fsdp_config: dict[str, Any] | None = None
    parallelism_config: dict[str, Any] | None = None
    megatron_lm_config: dict[str, Any] | None = None
    mpirun_config: dict[str, Any] | None = None
    downcast_bf16: bool = False
    tpu_name: str | None = None
    tpu_zone: str | None = None
    tpu_use_cluster: bool = False
    tpu_use_sudo: bool = False
    command_file: str | None = None
    commands: list[str] | None = None
    tpu_vm: list[str] | None = None
    tpu_env: list[str] | None = None
    dynamo_config: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        for block in ("fp8_config", "deepspeed_config", "fsdp_config", "parallelism_config",
                      "megatron_lm_config", "mpirun_config"):
            if getattr(self, block) is None:
                setattr(self, block, {})
        super().__post_init__()


def _path(path: str | os.PathLike[str] | None) -> str:
    if path is None:
        from ..launch.config_file import default_config_path

        return os.fspath(default_config_path()[0])
    return os.fspath(path)


def _read_yaml(path: str) -> Any:
    from ..launch.config_file import load_yaml

    if not os.path.isfile(path):
        raise FileNotFoundError(f"The configuration file `{path}` does not exist; pass an "
                                "existing file, or write one with `accel config`")
    return load_yaml(path)


def load_config_from_file(config_file: str | os.PathLike[str] | None) -> ClusterConfig:
    """The config file ``config_file`` (default: the one ``accel launch`` uses without
    ``--config_file``) as a :class:`ClusterConfig`; ``.json`` files are read as JSON.

    Raises:
        FileNotFoundError: no such file.
        ValueError: unknown keys, a bad ``distributed_type``, or a SageMaker file.
    """
    path = _path(config_file)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"The passed configuration file `{path}` does not exist; pass "
                                "an existing file, or write one with `accel config`")
    if path.endswith(".json"):
        return ClusterConfig.from_json_file(path)
    return ClusterConfig.from_yaml_file(path)
