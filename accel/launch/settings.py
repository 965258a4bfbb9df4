"""Resolve ``accel launch`` settings: flag > environment > config file > default, with sources.

Every setting remembers where it came from (``flag --num_processes``, ``env ACCEL_DEBUG``,
``config /path/file.yaml``, ``default``, ``detected ...``) so that the launcher can print it.
Nothing here imports torch: the number of visible GPUs is passed in as a callable and only
called when the device choice needs it.

Example:
    >>> s = resolve_settings({"device": "cpu", "num_processes": 4, "script": "t.py"},
    ...                      environ={}, config=None, gpu_count=lambda: 0, cpu_count=8,
    ...                      run_id="x")
    >>> (s.num_processes, s.device, s.num_cpu_threads_per_process, s.sources["device"])
    (4, 'cpu', 2, 'flag --cpu')
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._base.parse import parse_bool, parse_choice, parse_float, parse_gpu_ids, parse_int
from ..config.settings import parse_mixed_precision
from ..env import (
    DYNAMO_BACKENDS,
    DYNAMO_MODES,
    cuda_visible_devices,
    launch_setting_source,
    sync_batchnorm_mode,
)
from .config_file import ConfigFile
from .core import (
    LOOPBACK,
    MULTI_NODE_RUN_ID,
    default_backend,
    default_port,
    default_threads,
    exposed_port_warning,
)
from .errors import CLIError
from .hosts import HostLayout, host_layout, parse_hosts, read_hostfile
from .sharding import Lookup, resolve_fsdp

__all__ = ["LOOPBACK", "LaunchSettings", "resolve_settings", "settings_table"]

_DEVICES = ("cpu", "cuda", "xla", "mps")
#: A parser of one setting: (raw value, what to call it in errors) -> value; raises ValueError.
_Parse = Callable[[Any, str], Any]


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchSettings:
    """Everything needed to build the torchrun command line and the workers' environment."""

    script: str
    module: bool = False
    script_args: tuple[str, ...] = ()
    num_processes: int = 1
    num_machines: int = 1
    machine_rank: int = 0
    main_process_ip: str = LOOPBACK
    main_process_port: int = 0  # 0: the c10d store binds a free port (single node only)
    device: str = "cpu"
    gpu_ids: str | None = None
    #: CUDA_VISIBLE_DEVICES for the workers (``gpu_ids`` mapped through the launcher's own).
    cuda_visible_devices: str | None = None
    mixed_precision: str = "no"
    gradient_accumulation_steps: int = 1
    num_cpu_threads_per_process: int = 1
    max_restarts: int = 0
    monitor_interval: float = 0.1
    rdzv_backend: str = "c10d"
    rdzv_conf: str = ""
    rdzv_id: str = "accel"
    tee: str | None = None
    log_dir: str | None = None
    debug: bool = False
    config_file: str | None = None
    python: str = sys.executable
    #: Run the target as an executable (torchrun's ``--no-python``), not with Python.
    no_python: bool = False
    #: torchrun's ``--role`` (a label of the workers); None: torchrun's default.
    role: str | None = None
    #: Bind each GPU worker to the CPUs of its GPU's NUMA node (torchrun's ``--numa-binding``).
    enable_cpu_affinity: bool = False
    #: Start the workers with ``mpirun`` on the hosts of this file (CPU only), not torchrun.
    mpirun_hostfile: str | None = None
    #: ``dynamo_*`` settings (and ``sync_batchnorm``) the user chose (flag, env, config),
    #: exported as ``ACCEL_DYNAMO_*`` (``ACCEL_SYNC_BATCHNORM``).
    dynamo: dict[str, Any] = field(default_factory=dict)
    #: shard models with FSDP2 (``--use_fsdp``): ``ACCEL_USE_FSDP`` and the ``fsdp_*`` /
    #: ``parallelism_config_*`` settings the user chose, exported as ``ACCEL_<NAME>``
    use_fsdp: bool = False
    fsdp: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    #: ``-H``/``--hostfile``: the processes of each machine (``a:2,b:2``); None without a list.
    hosts: str | None = None

    @property
    def nproc_per_node(self) -> int:
        return self.num_processes // self.num_machines

    def explicit(self, name: str) -> bool:
        """True when the value came from a flag, the environment or the config file."""
        return not self.sources.get(name, "default").startswith(("default", "detected"))


def _int(minimum: int, maximum: int | None = None) -> _Parse:
    return lambda value, what: parse_int(value, name=what, minimum=minimum, maximum=maximum)


def _seconds(value: Any, name: str) -> float:
    return parse_float(value, name=name, above=0, what="a number of seconds")


def _bool(value: Any, what: str) -> bool:
    return parse_bool(value, name=what, empty=False)


def _text(value: Any, what: str) -> str:
    return str(value)


def _stripped(value: Any, what: str) -> str:
    return str(value).strip()


def _device(value: Any, name: str) -> str:
    kind = str(value).split(":")[0]  # "cuda:1" names the kind cuda
    return parse_choice(kind, name=name, choices=_DEVICES, aliases={"gpu": "cuda"},
                        what="a device kind")


def _precision(value: Any, what: str) -> str:
    try:
        return parse_mixed_precision("no" if value is False else str(value)).value
    except ValueError:
        raise CLIError(f"{what}={value!r} is not a mixed precision mode; expected no, fp16 or "
                       "bf16") from None


class _Sources:
    """Looks a setting up in flags, then environment, then config file; records the source."""

    def __init__(self, flags: Mapping[str, Any], environ: Mapping[str, str] | None,
                 config: ConfigFile | None) -> None:
        self.flags, self.environ, self.config = flags, environ, config
        self.sources: dict[str, str] = {}
        self.device_flag = "--cpu"  # or --multi_gpu / --tpu: the flag that set "device"
        #: settings given through another spelling (``-np``, ``--gpus``): name -> flag
        self.spelling: dict[str, str] = {}

    def get(self, name: str, *, parse: _Parse, default: Any,
            default_source: str = "default") -> Any:
        flag = self.spelling.get(name, f"--{name}") if name != "device" else self.device_flag
        if self.flags.get(name) is not None:
            return self._take(name, parse=parse, raw=self.flags[name], source=f"flag {flag}",
                              what=flag)
        found = launch_setting_source(name, self.environ)
        if found is not None:
            var, raw = found
            return self._take(name, parse=parse, raw=raw, source=f"env {var}", what=var)
        if self.config is not None and name in self.config.values:
            where = f"config {self.config.path}"
            return self._take(name, parse=parse, raw=self.config.values[name], source=where,
                              what=f"{name} in {self.config.path}")
        self.sources[name] = default_source
        return default

    def _take(self, name: str, *, parse: _Parse, raw: Any, source: str, what: str) -> Any:
        self.sources[name] = source
        try:
            return parse(raw, what)
        except ValueError as exc:  # the validators' errors are the command line's
            raise CLIError(str(exc)) from None


#: (alias flag's dest, setting, alias as typed): horovodrun's and Paddle's spellings.
_ALIASES = (("np", "num_processes", "-np"), ("gpus", "gpu_ids", "--gpus"))


def _aliases(src: _Sources, flags: Mapping[str, Any]) -> dict[str, Any]:
    """Flags with ``-np``/``--gpus`` folded into the settings they spell."""
    out = dict(flags)
    for alias, name, flag in _ALIASES:
        value = out.pop(alias, None)
        if value is None:
            continue
        if out.get(name) is not None and str(out[name]) != str(value):
            raise CLIError(f"{flag} {value} contradicts --{name} {out[name]} (the same "
                           "setting); pass only one of them")
        if out.get(name) is None:
            out[name], src.spelling[name] = value, flag
    return out


def _host_list(src: _Sources, flags: Mapping[str, Any],
               is_local: Callable[[str], bool]) -> HostLayout | None:
    """``-H host:N,...`` or ``--hostfile F`` (horovodrun's): where the processes run."""
    given = [(flag, flags[name]) for name, flag in (("hosts", "-H"), ("hostfile", "--hostfile"))
             if flags.get(name)]
    if not given:
        return None
    flag, value = given[0]
    for other, why in (("--hostfile", len(given) > 1), ("--ips", flags.get("ips")),
                       ("--mpirun_hostfile", flags.get("mpirun_hostfile"))):
        if why:
            raise CLIError(f"{flag} and {other} both say where the processes run; pass only "
                           f"one of them (--mpirun_hostfile F starts them with mpirun on F's "
                           f"hosts; {flag} starts torchrun's agent on each listed host)")
    hosts, source = (parse_hosts(str(value)), "flag -H") if flag == "-H" else \
        (read_hostfile(str(value)), f"hostfile {value}")
    total = src.get("num_processes", parse=_int(1), default=None)
    layout = host_layout(hosts, total=total, source=source, is_local=is_local,
                         machine_rank=flags.get("machine_rank"))
    if total is None:
        src.sources["num_processes"] = f"default (the slots of {source})"
    src.sources["hosts"] = source
    return layout


def _machines(src: _Sources, *, flags: Mapping[str, Any], is_local: Callable[[str], bool],
              layout: HostLayout | None) -> tuple[int, int, str | None]:
    """(num_machines, machine_rank, main_process_ip), with Paddle-style ``--ips`` sugar."""
    ips = [ip.strip() for ip in str(flags.get("ips") or "").split(",") if ip.strip()]
    if layout is not None:
        return _machines_of_hosts(src, flags, layout)
    if not ips:
        machines = src.get("num_machines", parse=_int(1), default=1)
        rank = src.get("machine_rank", parse=_int(0), default=0)
        ip = src.get("main_process_ip", parse=_stripped, default=None)
        return machines, rank, ip
    local = [index for index, ip in enumerate(ips) if is_local(ip)]
    if not local:
        raise CLIError(f"--ips {','.join(ips)}: none of these addresses belongs to this machine; "
                       "list this machine's address (as the other machines reach it)")
    for name, value in (("num_machines", len(ips)), ("machine_rank", local[0]),
                        ("main_process_ip", ips[0])):
        given = flags.get(name)
        if given is not None and str(given) != str(value):
            raise CLIError(f"--{name} {given} contradicts --ips {','.join(ips)} (which implies "
                           f"{value}); pass only --ips")
        src.sources[name] = "flag --ips"
    return len(ips), local[0], ips[0]


def _machines_of_hosts(src: _Sources, flags: Mapping[str, Any],
                       layout: HostLayout) -> tuple[int, int, str | None]:
    if layout.num_machines > 1:
        ip: str | None = layout.main_host
        checked: tuple[tuple[str, Any], ...] = (("num_machines", layout.num_machines),
                                                 ("main_process_ip", ip))
    else:  # one machine: the rendezvous stays on it (loopback unless --main_process_ip)
        ip = src.get("main_process_ip", parse=_stripped, default=None)
        checked = (("num_machines", 1),)
    for name, value in checked:
        given = flags.get(name)
        if given is not None and str(given) != str(value):
            raise CLIError(f"--{name} {given} contradicts {layout.source} (which implies "
                           f"{value}); drop --{name}")
        src.sources[name] = layout.source
    rank_given = flags.get("machine_rank") is not None
    src.sources["machine_rank"] = "flag --machine_rank" if rank_given else layout.source
    return layout.num_machines, layout.machine_rank, ip


def _processes(src: _Sources, *, device: str, gpu_ids: str | None, machines: int,
               gpu_count: Callable[[], int], layout: HostLayout | None) -> tuple[int, int]:
    """(total processes, processes on this machine)."""
    pool = len(gpu_ids.split(",")) if gpu_ids else (gpu_count() if device == "cuda" else 0)
    if device == "cuda":
        default, why = pool * machines, f"detected ({pool} GPU(s) per machine)"
    else:
        default, why = machines, "default (1 per machine; pass -n N for more)"
    if layout is not None:
        total, per_node = layout.total, layout.local_processes
    else:
        total = int(src.get("num_processes", parse=_int(1), default=default, default_source=why))
        if total % machines:
            raise CLIError(f"--num_processes {total} is the total over {machines} machines and "
                           f"must be a multiple of {machines}")
        per_node = total // machines
    if device == "cuda" and per_node > pool:
        origin = "--gpu_ids" if gpu_ids else "CUDA_VISIBLE_DEVICES / the driver"
        raise CLIError(
            f"--num_processes asks for {per_node} process(es) per machine but only {pool} GPU(s) "
            f"are visible ({origin}); pass -n {pool * machines} or fewer, or --cpu for CPU "
            "processes"
        )
    return total, per_node


def _visible_for_workers(gpu_ids: str | None, environ: Mapping[str, str] | None,
                         gpus: Callable[[], int]) -> str | None:
    """``--gpu_ids`` index the GPUs this launcher sees: map them through its
    ``CUDA_VISIBLE_DEVICES``."""
    if not gpu_ids:
        return None
    ids = [int(item) for item in gpu_ids.split(",")]
    count = gpus()
    if max(ids) >= count:
        raise CLIError(f"--gpu_ids {gpu_ids} names GPU {max(ids)} but only {count} GPU(s) are "
                       f"visible (indices 0..{count - 1})")
    visible = cuda_visible_devices(environ)
    return ",".join(visible[i] if visible and i < len(visible) else str(i) for i in ids)


def _device_and_gpu_ids(src: _Sources, gpus: Callable[[], int],
                        warnings: list[str]) -> tuple[str, str | None]:
    device = src.get("device", parse=_device, default=None)
    if device is None:
        count = gpus()
        device = "cuda" if count > 0 else "cpu"
        src.sources["device"] = f"detected ({count} GPU(s))" if count else "detected (no GPU)"
    elif device == "cuda" and gpus() == 0:
        raise CLIError(f"device cuda was requested ({src.sources['device']}) but no GPU is "
                       "visible; check the driver and CUDA_VISIBLE_DEVICES, or use --cpu")
    gpu_ids = src.get("gpu_ids", parse=parse_gpu_ids, default=None)
    if gpu_ids and device != "cuda":
        warnings.append(f"gpu_ids {gpu_ids} ({src.sources['gpu_ids']}) is ignored: the device "
                        f"is {device}")
        gpu_ids, src.sources["gpu_ids"] = None, "default"
    return device, gpu_ids


def _rendezvous(src: _Sources, *, machines: int, backend: str, ip: str | None, port: int | None,
                free_port: Callable[[], int], warnings: list[str]) -> tuple[str, int]:
    if machines > 1:
        if not ip or not port:
            missing = [name for name, value in (("--main_process_ip", ip),
                                                ("--main_process_port", port)) if not value]
            raise CLIError(f"a job on {machines} machines needs {' and '.join(missing)} (the "
                           "address and port of machine rank 0, the same on every machine)")
        warnings.append(exposed_port_warning(ip, port))
        return ip, port
    if port is None:
        port = default_port(backend, machines, free_port)
        src.sources["main_process_port"] = "default (a free port)"
    return ip or LOOPBACK, port


def _choice(choices: tuple[str, ...], what: str) -> _Parse:
    return lambda value, name: parse_choice(value, name=name, choices=choices, what=what)


_DYNAMO: tuple[tuple[str, _Parse], ...] = (
    ("dynamo_backend", _choice(DYNAMO_BACKENDS, "a dynamo backend")),
    ("dynamo_mode", _choice(DYNAMO_MODES, "a torch.compile mode")),
    ("dynamo_use_fullgraph", _bool), ("dynamo_use_dynamic", _bool),
    ("dynamo_use_regional_compilation", _bool),
    # not a compile setting, but exported to the workers the same way (ACCEL_SYNC_BATCHNORM)
    ("sync_batchnorm", sync_batchnorm_mode),
)
#: (device, flag): the flags that choose the device.
_DEVICE_FLAGS = (("cpu", "--cpu"), ("cuda", "--multi_gpu"), ("xla", "--tpu"))


def _device_flag(flags: Mapping[str, Any]) -> tuple[str | None, str]:
    """(device, flag) chosen by ``--cpu`` / ``--multi_gpu`` / ``--tpu``; (None, "--cpu") if none."""
    given = [(device, flag) for device, flag in _DEVICE_FLAGS
             if (flags.get("device") == "cpu" if flag == "--cpu" else flags.get(flag[2:]))]
    if len(given) > 1:
        raise CLIError(f"{' and '.join(flag for _, flag in given)} contradict each other (each "
                       "chooses the device, as in Accelerate); pass only one of them")
    return given[0] if given else (None, "--cpu")


def _use_device_flag(src: _Sources, flags: Mapping[str, Any], config: ConfigFile | None) -> None:
    chosen, src.device_flag = _device_flag(flags)
    if chosen is None and config is not None and config.unsupported:
        raise CLIError(config.unsupported)  # a device flag overrides the file's type
    src.flags = {**flags, "device": chosen}


def _threads(src: _Sources, cpu_count: int, per_node: int) -> int:
    return int(src.get("num_cpu_threads_per_process", parse=_int(1),
                       default=default_threads(cpu_count, per_node),
                       default_source=f"default ({cpu_count} cores / {per_node} processes)"))


def _check_multi_gpu(src: _Sources, total: int) -> None:
    """``--multi_gpu`` is a no-op with 2+ processes; with fewer it is a mistake worth naming."""
    if src.device_flag != "--multi_gpu" or total >= 2:
        return
    origin = src.sources.get("num_processes", "default")
    if origin.startswith("detected"):
        raise CLIError(f"--multi_gpu needs at least 2 GPU processes but only {total} GPU is "
                       "visible and -n was not given; drop --multi_gpu to run on that GPU, or "
                       "pass --cpu -n N (without --multi_gpu) for N CPU processes")
    raise CLIError(f"--multi_gpu needs at least 2 processes (as in Accelerate), got "
                   f"num_processes {total} ({origin}); pass -n 2 or more, or drop --multi_gpu")


def _split_endpoint(text: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host:
        raise CLIError(f"--rdzv_endpoint {text!r} is not HOST:PORT (e.g. 10.0.0.1:29500 or "
                       "[fd00::1]:29500)")
    try:
        return host, parse_int(port, name="the port of --rdzv_endpoint", minimum=0, maximum=65535)
    except ValueError as exc:
        raise CLIError(str(exc)) from None


def _endpoint(src: _Sources, *, text: str | None, ip: str | None,
              port: int | None) -> tuple[str | None, int | None]:
    """``--rdzv_endpoint HOST:PORT`` sets the main process IP and port; a different IP or port
    from any other source is an error."""
    if not text:
        return ip, port
    host, number = _split_endpoint(text)
    for name, old, new in (("main_process_ip", ip, host), ("main_process_port", port, number)):
        if old is not None and str(old) != str(new):
            raise CLIError(f"--rdzv_endpoint {text} contradicts {name} {old} "
                           f"({src.sources.get(name)}); pass only one of them")
        src.sources[name] = "flag --rdzv_endpoint"
    return host, number


def _extras(src: _Sources, *, flags: Mapping[str, Any], device: str, warnings: list[str],
            layout: tuple[int, int]) -> dict[str, Any]:
    """The settings that only travel to torchrun or the workers (affinity, dynamo, FSDP, ...);
    ``layout``: (total processes, machines)."""
    if flags.get("no_python") and flags.get("module"):
        raise CLIError("--module and --no_python cannot be used together (as in Accelerate): "
                       "-m runs a Python module, --no_python runs an executable")
    affinity = src.get("enable_cpu_affinity", parse=_bool, default=False)
    if affinity and device != "cuda":
        warnings.append(f"enable_cpu_affinity ({src.sources['enable_cpu_affinity']}) is ignored: "
                        "it binds each worker to the CPUs of its GPU's NUMA node, and the device "
                        f"is {device}")
        affinity = False
    # Accepted for Accelerate's sake: it chose --master-addr/port over --rdzv-endpoint, which
    # torchrun's static rendezvous treats alike; accel's rendezvous is the same either way.
    src.get("same_network", parse=_bool, default=False)
    dynamo = {name: value for name, parse in _DYNAMO
              if (value := src.get(name, parse=parse, default=None)) is not None}
    hostfile = src.get("mpirun_hostfile", parse=_stripped, default=None) or None
    if hostfile is not None and device != "cpu":
        raise CLIError(f"--mpirun_hostfile starts CPU processes with mpirun (as in Accelerate) "
                       f"but the device is {device} ({src.sources['device']}); add --cpu, or "
                       "drop --mpirun_hostfile to start GPU processes with torchrun's agent")
    return {"no_python": bool(flags.get("no_python")), "role": src.get("role", parse=_stripped,
                                                                       default=None),
            "enable_cpu_affinity": affinity, "mpirun_hostfile": hostfile, "dynamo": dynamo,
            **_sharding(src, device=device, total=layout[0], machines=layout[1],
                        warnings=warnings)}


def _sharding(src: _Sources, *, device: str, total: int, machines: int,
              warnings: list[str]) -> dict[str, Any]:
    """``use_fsdp`` and the ``fsdp`` settings (see ``accel.launch.sharding``)."""
    return resolve_fsdp(Lookup(get=src.get, sources=src.sources), device=device, total=total,
                        machines=machines, warnings=warnings,
                        device_flag=src.device_flag if src.flags.get("device") else None)


def _placement(src: _Sources, flags: Mapping[str, Any], is_local: Callable[[str], bool],
               ) -> tuple[HostLayout | None, int, int, str | None, int | None]:
    """(host list, machines, machine rank, main process IP, port) from the flags."""
    layout = _host_list(src, flags, is_local)
    machines, machine_rank, ip = _machines(src, flags=flags, is_local=is_local, layout=layout)
    if machine_rank >= machines:
        raise CLIError(f"--machine_rank {machine_rank} must be < --num_machines {machines}")
    port = src.get("main_process_port", parse=_int(0, 65535), default=None)
    if port is None and layout is not None and machines > 1:  # horovodrun takes no port
        port = default_port("static", machines, lambda: 0)
        src.sources["main_process_port"] = "default (torchrun's port)"
    ip, port = _endpoint(src, text=flags.get("rdzv_endpoint"), ip=ip, port=port)
    return layout, machines, machine_rank, ip, port


#: Settings that are one value each: (name, parser, default).
_SCALARS: tuple[tuple[str, _Parse, Any], ...] = (
    ("mixed_precision", _precision, "no"), ("gradient_accumulation_steps", _int(1), 1),
    ("max_restarts", _int(0), 0), ("monitor_interval", _seconds, 0.1),
    ("rdzv_conf", _text, ""), ("tee", _text, None), ("log_dir", _text, None),
    ("debug", _bool, False))


def _scalars(src: _Sources) -> dict[str, Any]:
    return {name: src.get(name, parse=parse, default=default) for name, parse, default in _SCALARS}


def resolve_settings(
    flags: Mapping[str, Any], *, environ: Mapping[str, str] | None, config: ConfigFile | None,
    gpu_count: Callable[[], int], cpu_count: int, run_id: str,
    is_local_address: Callable[[str], bool] = lambda ip: False,
    free_port: Callable[[], int] = lambda: 0,
) -> LaunchSettings:
    """Combine flags, environment and config file into ``LaunchSettings``.

    Args:
        flags: parsed command-line values; ``None`` means "not given". ``device`` is "cpu" when
            ``--cpu`` was passed. Also ``script``, ``module``, ``script_args``, ``ips``.
        environ: the launcher's environment (None: this process's), read through
            ``accel.env`` for the variables its ``ACCEL_*`` table names as setting sources.
        config: the parsed config file, if one is used.
        gpu_count: visible GPUs; called only when the device may be CUDA.
        cpu_count: usable CPU cores (threads per process default to cores / processes).
        run_id: rendezvous id for a single-node c10d rendezvous (a fresh uuid per launch).
        is_local_address: whether an IP belongs to this machine (for ``--ips``).
        free_port: picks a free port (only for a single-node *static* rendezvous).

    Raises:
        CLIError: a value is invalid or settings contradict each other.
    """
    src = _Sources(flags, environ, config)
    flags = _aliases(src, flags)
    warnings: list[str] = []
    gpus = functools.cache(gpu_count)  # probe at most once, and only if the device may be CUDA
    _use_device_flag(src, flags, config)
    layout, machines, machine_rank, ip, port = _placement(src, flags, is_local_address)
    device, gpu_ids = _device_and_gpu_ids(src, gpus, warnings)
    visible = _visible_for_workers(gpu_ids, environ, gpus)
    total, per_node = _processes(src, device=device, gpu_ids=gpu_ids, machines=machines,
                                 gpu_count=gpus, layout=layout)
    _check_multi_gpu(src, total)
    threads = _threads(src, cpu_count, per_node)
    backend = src.get("rdzv_backend", parse=_stripped, default=default_backend(machines))
    extras = _extras(src, flags=flags, device=device, warnings=warnings, layout=(total, machines))
    if extras["mpirun_hostfile"] is None:
        ip, port = _rendezvous(src, machines=machines, backend=backend, ip=ip, port=port,
                               free_port=free_port, warnings=warnings)
    return LaunchSettings(
        script=str(flags["script"]), module=bool(flags.get("module")),
        script_args=tuple(flags.get("script_args") or ()), num_processes=total,
        num_machines=machines, machine_rank=machine_rank, main_process_ip=ip or LOOPBACK,
        main_process_port=port or 0, device=device, gpu_ids=gpu_ids,
        cuda_visible_devices=visible, num_cpu_threads_per_process=threads,
        rdzv_backend=backend, rdzv_id=run_id if machines == 1 else MULTI_NODE_RUN_ID,
        config_file=config.path if config is not None else None, **_scalars(src),
        python=str(flags.get("python") or sys.executable),
        hosts=layout.describe() if layout is not None else None,
        sources=dict(src.sources), warnings=tuple(warnings), **extras,
    )


_TABLE = ("num_processes", "hosts", "num_machines", "machine_rank", "main_process_ip",
          "main_process_port", "device", "gpu_ids", "mixed_precision",
          "gradient_accumulation_steps", "num_cpu_threads_per_process", "max_restarts",
          "rdzv_backend", "log_dir", "debug", "enable_cpu_affinity", "mpirun_hostfile")
#: Rows shown only when the user set them.
_IF_GIVEN = ("enable_cpu_affinity", "mpirun_hostfile", "hosts", "log_dir")


def settings_table(settings: LaunchSettings, config_note: str | None = None) -> str:
    """A short table: setting, value, where it came from.

    Example:
        >>> s = LaunchSettings(script="t.py", sources={"num_processes": "flag --num_processes"})
        >>> "flag --num_processes" in settings_table(s)
        True
    """
    rows: list[tuple[str, str, str]] = []
    for name in _TABLE:
        if settings.num_machines == 1 and name in ("num_machines", "machine_rank") or \
                name in _IF_GIVEN and not settings.explicit(name):
            continue
        value: Any = getattr(settings, name)
        if name == "main_process_port" and value == 0:
            value = "free port"
        if name == "gpu_ids" and value is None:
            value = "all" if settings.device == "cuda" else "-"
        rows.append((name, str(value), settings.sources.get(name, "default")))
    rows += [(name, str(value), settings.sources.get(name, "default"))
             for name, value in {**settings.dynamo, **({"use_fsdp": True, **settings.fsdp}
                                                      if settings.use_fsdp else {})}.items()]
    config = config_note or "none"
    rows.append(("config file", settings.config_file or "-", config))
    width = max(len(row[0]) for row in rows)
    vwidth = max(len(row[1]) for row in rows)
    lines = ["accel launch settings (value, source):"]
    lines += [f"  {n:<{width}}  {v:<{vwidth}}  {s}" for n, v, s in rows]
    return "\n".join(lines)
