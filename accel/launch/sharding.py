"""The FSDP settings of ``accel launch``: Accelerate's ``--use_fsdp``, ``--fsdp_*`` and
``--parallelism_config_*`` flags, or a config file's ``distributed_type: FSDP`` with its
``fsdp_config`` and ``parallelism_config`` blocks.

They are validated here, before any worker starts, by building the
``FullyShardedDataParallelPlugin`` and ``ParallelismConfig`` they describe (neither imports
torch), so that a bad value is a one-line error naming the flag, variable or config key it came
from. The workers get them as ``ACCEL_USE_FSDP`` and ``ACCEL_FSDP_*`` /
``ACCEL_PARALLELISM_CONFIG_*`` variables, values as written, and ``Accelerator()`` builds the same
plugin from them.

Example:
    >>> found = {"use_fsdp": True, "fsdp_reshard_after_forward": "false"}
    >>> lookup = Lookup(get=lambda name, parse, default: parse(found[name], name)
    ...                 if name in found else default,
    ...                 sources={name: "flag --" + name for name in found})
    >>> resolve_fsdp(lookup, device="cpu", total=2, machines=1, warnings=[])
    {'use_fsdp': True, 'fsdp': {'fsdp_reshard_after_forward': 'false'}}
"""

from __future__ import annotations

import warnings as _warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from .._base.parse import parse_bool
from ..config.fsdp import (
    LAUNCH_FSDP,
    LAUNCH_PARALLELISM,
    parallelism_from_launch,
    plugin_from_launch,
)
from ..config.parallelism import ParallelismConfig, refuse_model_parallel
from .errors import CLIError

__all__ = ["FSDP_SETTINGS", "PARALLELISM_SETTINGS", "WORKER_SIZES", "Lookup", "resolve_fsdp",
           "setting_text"]

#: ``accel launch`` settings that describe the plugin (flag names without ``--``)
FSDP_SETTINGS = tuple(LAUNCH_FSDP)
#: ``accel launch`` settings that describe the device mesh (tp/cp/sp sizes: 1 or refused)
PARALLELISM_SETTINGS = tuple(LAUNCH_PARALLELISM)
#: the mesh sizes that reach workers (the others can only be 1)
WORKER_SIZES = ("parallelism_config_dp_replicate_size", "parallelism_config_dp_shard_size")


class _Get(Protocol):
    def __call__(self, name: str, *, parse: Callable[[Any, str], Any], default: Any) -> Any: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class Lookup:
    """How settings are looked up (flag > environment > config file) and where each came from:
    ``get(name, parse=..., default=...)`` and ``sources[name]`` ("flag --x", "env VAR",
    "config PATH")."""

    get: _Get
    sources: Mapping[str, str]


def setting_text(value: Any, what: str = "") -> str:
    """A setting as the workers' variable holds it: YAML booleans as ``true``/``false``, a
    list of class names comma-separated, everything else as text.

    Example:
        >>> setting_text(["Block", "Layer"]), setting_text(False), setting_text(" 2 ")
        ('Block,Layer', 'false', '2')
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(str(item).strip() for item in value)
    return str(value).strip()


def _bool(value: Any, what: str) -> bool:
    return parse_bool(value, name=what, empty=False)


def _where(lookup: Lookup, name: str) -> str:
    """The flag, variable or config key a setting came from, as errors name it."""
    source = lookup.sources.get(name, "")
    if source.startswith("config "):
        return f"{name} in {source[len('config '):]}"
    return source.split(" ", 1)[1] if " " in source else f"--{name}"


def resolve_fsdp(lookup: Lookup, *, device: str, total: int, machines: int,
                 warnings: list[str], device_flag: str | None = None) -> dict[str, Any]:
    """``{"use_fsdp": bool, "fsdp": {setting: value}}`` for ``LaunchSettings``, validated.

    ``device_flag``: ``--multi_gpu`` / ``--tpu`` when given; they choose DDP or XLA over a
    config file's ``distributed_type: FSDP``, as in Accelerate.

    Raises:
        CLIError: a bad value (naming where it came from), mesh sizes that do not fit
            ``total`` processes, FSDP on XLA, on one process, or mesh sizes without FSDP.
    """
    use = bool(lookup.get("use_fsdp", parse=_bool, default=False))
    if use and device_flag in ("--multi_gpu", "--tpu") and \
            lookup.sources.get("use_fsdp", "").startswith("config"):
        use = False  # the device flag overrides the file's distributed_type
    values = {name: value for name in FSDP_SETTINGS
              if (value := lookup.get(name, parse=setting_text, default=None)) not in (None, "")}
    sizes = {name: value for name in PARALLELISM_SETTINGS
             if (value := lookup.get(name, parse=setting_text, default=None)) not in (None, "")}
    given = ", ".join(_where(lookup, name) for name in [*values, *sizes])
    if not use:
        if sizes:
            raise CLIError(f"{given}: the device mesh is FSDP's; add --use_fsdp (or "
                           "distributed_type: FSDP in the config file)")
        if values:
            warnings.append(f"{given} ignored: FSDP settings apply with --use_fsdp (or "
                            "distributed_type: FSDP in the config file)")
        return {"use_fsdp": False, "fsdp": {}}
    if device == "xla":
        raise CLIError("--use_fsdp: FSDP runs on CPU and CUDA devices; on XLA drop --use_fsdp "
                       "(accel uses torch_xla's data parallelism)")
    mesh = _validate(lookup, values=values, sizes=sizes, warnings=warnings)
    _check_mesh(mesh, total=total, machines=machines, given=given)
    return {"use_fsdp": True,
            "fsdp": {**values, **{name: int(sizes[name]) for name in WORKER_SIZES
                                  if name in sizes}}}


def _validate(lookup: Lookup, *, values: dict[str, str], sizes: dict[str, str],
              warnings: list[str]) -> ParallelismConfig | None:
    """Build the plugin and the mesh config (the launcher's warnings collect theirs)."""
    with _warnings.catch_warnings(record=True) as caught:
        _warnings.simplefilter("always")
        try:
            plugin_from_launch(values, lambda name: _where(lookup, name))
            mesh = parallelism_from_launch(sizes, lambda name: _where(lookup, name)) \
                if sizes else None
            if mesh is not None:
                refuse_model_parallel(mesh)
        except ValueError as exc:
            raise CLIError(_blamed(str(exc), lookup=lookup, sizes=sizes)) from None
    warnings.extend(dict.fromkeys(str(item.message) for item in caught))
    return mesh


def _blamed(message: str, *, lookup: Lookup, sizes: dict[str, str]) -> str:
    """``message`` of a refused model-parallel size, led by the flag or key that set it."""
    if not message.startswith("ParallelismConfig("):
        return message
    given = [f"{_where(lookup, name)} {value}" for name, value in sizes.items()
             if name.rsplit("_", 2)[-2] in ("tp", "cp", "sp") and str(value) != "1"]
    return f"{', '.join(given)}: {message}" if given else message


def _check_mesh(mesh: ParallelismConfig | None, *, total: int, machines: int, given: str) -> None:
    if mesh is None:  # one process runs too (FSDP2 on a one-device mesh; the script warns)
        return
    try:
        mesh.mesh_shape(total, total // machines)
    except ValueError as exc:
        raise CLIError(f"{given}: {exc} ({total} here; see -n/--num_processes)") from None
