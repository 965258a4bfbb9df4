"""The launch core shared by ``accel launch`` and ``notebook_launcher``.

Both hand torchrun's elastic agent a job: ``accel launch`` as a torchrun command line (the
agent runs in the launcher process and execs ``accel.launch.bootstrap`` per worker),
``notebook_launcher`` as a ``LaunchConfig`` (the agent forks the caller). What they share:

- ``WorkerSpec``: what the workers are told (device, threads, ``ACCEL_*`` settings, GPUs), as
  the environment they inherit;
- ``Rendezvous``: how the agents meet (backend, endpoint, run id, node rank), as torchrun
  arguments or ``LaunchConfig`` fields, and the defaults (``default_backend``,
  ``default_port``);
- ``extract_failures``: torchelastic's per-rank failures (with our error files) as ``Failure``
  records for the ROOT CAUSE report or the re-raised exception.

Nothing here imports torch at import time.

Example:
    >>> rdzv = Rendezvous(backend="c10d", host="127.0.0.1", port=0, run_id="r1")
    >>> rdzv.torchrun_args()
    ['--rdzv-backend', 'c10d', '--rdzv-endpoint', '127.0.0.1:0', '--rdzv-id', 'r1']
    >>> WorkerSpec(device="cpu", num_threads=2).environment()["ACCEL_DEVICE"]
    'cpu'
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..env import DEFAULT_PORT, EnvSettings, worker_environment
from .report import Failure, failure_from_error_data

__all__ = [
    "LOOPBACK",
    "MULTI_NODE_RUN_ID",
    "Rendezvous",
    "WorkerSpec",
    "accel_extra",
    "default_backend",
    "default_port",
    "default_threads",
    "endpoint",
    "exposed_port_warning",
    "extract_failures",
    "gpu_count",
    "is_local_address",
]

LOOPBACK = "127.0.0.1"
#: Run id of a multi-node rendezvous: every machine must use the same one (the static
#: rendezvous prefixes every store key with it), and a fresh one per call cannot be shared.
MULTI_NODE_RUN_ID = "accel"


def gpu_count() -> int:
    """CUDA devices visible to this process (imports torch: call only after parsing)."""
    from ..device.cuda import CUDADevice

    return CUDADevice.count()


def is_local_address(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine: one of its addresses binds.

    Example:
        >>> is_local_address("127.0.0.1"), is_local_address("192.0.2.77")
        (True, False)
    """
    import socket

    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_DGRAM)
    except OSError:
        return False
    for family, kind, proto, _, address in infos:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.bind((address[0], 0))  # only an address of this machine can be bound
                return True
        except OSError:
            continue
    return False


def default_threads(cpu_count: int, processes_per_node: int) -> int:
    """Intra-op threads per worker: the usable cores shared out, at least one.

    Example:
        >>> default_threads(8, 3)
        2
    """
    return max(1, cpu_count // max(1, processes_per_node))


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerSpec:
    """What every worker of a launch is told, through the environment it inherits.

    Attributes:
        device: ``ACCEL_DEVICE``, always exported (the launcher chose the process count for it).
        num_threads: ``OMP_NUM_THREADS`` and ``ACCEL_NUM_THREADS``.
        mixed_precision, gradient_accumulation_steps: exported only when not None: a launcher
            passes them only when the user chose them, so that a worker's ``Accelerator(...)``
            arguments never disagree with a mere launcher default.
        debug: ``ACCEL_DEBUG=1``.
        config_file: ``ACCEL_CONFIG_FILE`` (made absolute: workers may change directory).
        cuda_visible_devices: the workers' ``CUDA_VISIBLE_DEVICES``; None inherits ours.
        layout: ``(total processes, machines)`` requested, checked by the bootstrap.
        fresh_rdzv_store: one c10d store per restart (see ``accel.env.worker_environment``).
        dynamo: ``EnvSettings`` ``dynamo_*`` fields to export as ``ACCEL_DYNAMO_*`` (only those
            the user chose).
        use_fsdp, fsdp: ``ACCEL_USE_FSDP`` and the ``EnvSettings`` ``fsdp_*`` /
            ``parallelism_config_*`` fields the user chose (``ACCEL_FSDP_*``, ...).
        rank_log_dir: ``accel launch --log_dir``: the workers link their log files there as
            ``workerlog.<rank>`` (made absolute: workers may change directory).
    """

    device: str
    num_threads: int
    mixed_precision: str | None = None
    gradient_accumulation_steps: int | None = None
    debug: bool = False
    config_file: str | None = None
    cuda_visible_devices: str | None = None
    layout: tuple[int, int] | None = None
    fresh_rdzv_store: bool = False
    dynamo: Mapping[str, Any] = field(default_factory=dict)
    use_fsdp: bool = False
    fsdp: Mapping[str, Any] = field(default_factory=dict)
    rank_log_dir: str | None = None

    def environment(self) -> dict[str, str]:
        """The variables to export to the workers."""
        settings = EnvSettings(
            device=self.device, mixed_precision=self.mixed_precision,
            gradient_accumulation_steps=self.gradient_accumulation_steps, debug=self.debug,
            config_file=os.path.abspath(self.config_file) if self.config_file else None,
            launched=True, num_threads=self.num_threads, **self.dynamo,
            use_fsdp=self.use_fsdp, **self.fsdp)
        logs = os.path.abspath(self.rank_log_dir) if self.rank_log_dir else None
        return worker_environment(settings, cuda_visible_devices=self.cuda_visible_devices,
                                  layout=self.layout, fresh_rdzv_store=self.fresh_rdzv_store,
                                  rank_log_dir=logs)


def endpoint(host: str, port: int) -> str:
    """``host:port``, with an IPv6 address in brackets.

    Example:
        >>> endpoint("::1", 29500)
        '[::1]:29500'
    """
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def default_backend(num_nodes: int) -> str:
    """``static`` on several machines (as Accelerate does), else ``c10d`` with a free port."""
    return "static" if num_nodes > 1 else "c10d"


def default_port(backend: str, num_nodes: int, free_port: Callable[[], int]) -> int:
    """The rendezvous port when none was given.

    One machine, c10d: 0, so the agent's store binds a port chosen by the kernel at bind time
    (no race between two jobs). One machine, static: a free port now (static needs a number).
    Several machines: torchrun's default port (they must agree on it).
    """
    if num_nodes > 1:
        return DEFAULT_PORT
    return free_port() if backend == "static" else 0


def exposed_port_warning(host: str, port: int) -> str:
    """The warning for a rendezvous reachable from other machines."""
    return (f"the rendezvous port {host}:{port} is unauthenticated: anyone who can reach it can "
            "join or disrupt this job; keep it on a private network")


@dataclass(frozen=True, kw_only=True, slots=True)
class Rendezvous:
    """How the agents of one job meet.

    Attributes:
        backend: ``static``, ``c10d``, ``etcd`` or ``etcd-v2``.
        host: address of machine rank 0 (or the loopback address on one machine).
        port: rendezvous port; 0 lets a single-node c10d store bind a free port.
        run_id: rendezvous id (a fresh one per single-node launch; shared on several).
        num_nodes: machines in the job.
        node_rank: this machine's rank (used by the static backend).
        conf: extra rendezvous options, torchrun's ``--rdzv-conf`` ``k=v,...``.
    """

    backend: str
    host: str
    port: int
    run_id: str
    num_nodes: int = 1
    node_rank: int = 0
    conf: str = ""

    @property
    def endpoint(self) -> str:
        return endpoint(self.host, self.port)

    def torchrun_args(self) -> list[str]:
        """The rendezvous part of a torchrun command line."""
        if self.backend == "static":
            argv = ["--rdzv-backend", "static", "--node-rank", str(self.node_rank),
                    "--master-addr", self.host, "--master-port", str(self.port)]
        else:
            argv = ["--rdzv-backend", self.backend, "--rdzv-endpoint", self.endpoint,
                    "--rdzv-id", self.run_id]
        return argv + (["--rdzv-conf", self.conf] if self.conf else [])

    def launch_config(self) -> dict[str, Any]:
        """Keyword arguments of ``torch.distributed.launcher.api.LaunchConfig``."""
        configs: dict[str, Any] = dict(item.split("=", 1) for item in self.conf.split(",")
                                       if "=" in item)
        if self.backend == "static":
            configs["rank"] = self.node_rank
        kwargs: dict[str, Any] = {"min_nodes": self.num_nodes, "max_nodes": self.num_nodes,
                                  "run_id": self.run_id, "rdzv_backend": self.backend,
                                  "rdzv_endpoint": self.endpoint}
        if configs:
            kwargs["rdzv_configs"] = configs
        return kwargs


def accel_extra(error_file_data: object) -> Mapping[str, Any]:
    """The ``extraInfo.accel`` fields of a worker's error file (empty when there are none)."""
    message = error_file_data.get("message") if isinstance(error_file_data, Mapping) else None
    info = message.get("extraInfo") if isinstance(message, Mapping) else None
    extra = info.get("accel") if isinstance(info, Mapping) else None
    return extra if isinstance(extra, Mapping) else {}


def extract_failures(failures: Mapping[Any, Any], now_ns: int | None = None) -> list[Failure]:
    """``Failure`` records from torchelastic's ``{rank: ProcessFailure}`` mapping.

    Takes ``ChildFailedError.failures`` or ``RunResult.failures``; ``now_ns`` stands in for
    the time of failures whose error file has none.
    """
    now = time.time_ns() if now_ns is None else now_ns
    out = []
    for rank, failure in failures.items():
        data = failure.error_file_data if isinstance(failure.error_file_data, Mapping) else None
        out.append(failure_from_error_data(int(rank), local_rank=int(failure.local_rank),
                                           pid=int(failure.pid),
                                           exitcode=int(failure.exitcode), data=data,
                                           fallback_time_ns=now))
    return out
