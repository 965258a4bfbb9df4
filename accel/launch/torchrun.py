"""Turn ``LaunchSettings`` into a torchrun command line and run it with torchrun's elastic agent.

Single node: ``--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:0``. Port 0 makes the agent's c10d
TCP store bind a free port chosen by the kernel at bind time, and the workers connect to that
store (``TORCHELASTIC_USE_AGENT_STORE``): no port is picked ahead of time, so two jobs on one
machine can never race for the same port or join each other's rendezvous (each gets a fresh
``--rdzv-id`` too). An explicit ``--main_process_port`` is honoured instead of 0.

Multiple machines: the ``static`` rendezvous by default (``--node-rank`` = ``--machine_rank``,
``--master-addr/--master-port`` = main process IP/port, as Accelerate does), or ``c10d`` at that
endpoint with ``--rdzv_backend c10d``.

Example:
    >>> from accel.launch.settings import LaunchSettings
    >>> s = LaunchSettings(script="train.py", num_processes=2, device="cpu", rdzv_id="r1",
    ...                    python="python")
    >>> build_torchrun_argv(s)[:8]  # doctest: +NORMALIZE_WHITESPACE
    ['--nnodes', '1', '--nproc-per-node', '2', '--rdzv-backend', 'c10d',
     '--rdzv-endpoint', '127.0.0.1:0']
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from ..env import agent_environment, apply, rank_roles
from ..env.ps_layout import PS_LAYOUT_VARIABLE
from .core import Rendezvous, WorkerSpec, extract_failures
from .errors import CLIError
from .procs import become_subreaper, reap_children
from .report import format_failure_report, root_failure
from .settings import LaunchSettings

__all__ = ["BOOTSTRAP_MODULE", "INTEL_OPENMP", "build_torchrun_argv", "rendezvous_of",
           "run_torchrun", "worker_command", "worker_env", "worker_spec"]

BOOTSTRAP_MODULE = "accel.launch.bootstrap"


def rendezvous_of(settings: LaunchSettings) -> Rendezvous:
    """The rendezvous these settings resolved to."""
    s = settings
    return Rendezvous(backend=s.rdzv_backend, host=s.main_process_ip, port=s.main_process_port,
                      run_id=s.rdzv_id, num_nodes=s.num_machines, node_rank=s.machine_rank,
                      conf=s.rdzv_conf)


def build_torchrun_argv(settings: LaunchSettings) -> list[str]:
    """The exact ``torchrun`` arguments for these settings (a pure function).

    The entrypoint is always ``<python> -u -m accel.launch.bootstrap`` (with ``--no-python``),
    followed by the user's script (or ``-m module``) and its arguments.
    """
    s = settings
    argv = ["--nnodes", str(s.num_machines), "--nproc-per-node", str(s.nproc_per_node)]
    argv += rendezvous_of(s).torchrun_args()
    argv += ["--max-restarts", str(s.max_restarts),
             "--monitor-interval", format(s.monitor_interval, "g")]
    if s.tee is not None or s.log_dir is not None:
        # --log_dir alone: torchrun writes files only for teed or redirected streams, so tee
        # both (the console keeps showing the output) and the workers link them per rank.
        argv += ["--tee", s.tee if s.tee is not None else "3"]
    if s.log_dir is not None:
        argv += ["--log-dir", s.log_dir]
    if s.role is not None:
        argv += ["--role", s.role]
    if s.enable_cpu_affinity:
        argv += ["--numa-binding", "node"]
    return argv + ["--no-python", *worker_command(s)]


def worker_command(settings: LaunchSettings) -> list[str]:
    """What every worker runs: ``<python> -u -m accel.launch.bootstrap`` and the target.

    The bootstrap runs a script or ``-m module`` in its own interpreter, and with
    ``--no-python`` execs the target after its checks (the executable replaces it).
    """
    s = settings
    target = ["-m", s.script] if s.module else ["--no-python", s.script] if s.no_python \
        else [s.script]
    return [s.python, "-u", "-m", BOOTSTRAP_MODULE, *target, *s.script_args]


def worker_spec(settings: LaunchSettings) -> WorkerSpec:
    """What the workers of this launch are told.

    Mixed precision and accumulation steps are passed only when they came from a flag, the
    environment or a config file (see ``WorkerSpec``).
    """
    s = settings
    return WorkerSpec(
        device=s.device, num_threads=s.num_cpu_threads_per_process,
        mixed_precision=s.mixed_precision if s.explicit("mixed_precision") else None,
        gradient_accumulation_steps=s.gradient_accumulation_steps
        if s.explicit("gradient_accumulation_steps") else None,
        debug=s.debug, config_file=s.config_file, cuda_visible_devices=s.cuda_visible_devices,
        layout=(s.num_processes, s.num_machines),
        fresh_rdzv_store=s.max_restarts > 0 and s.rdzv_backend == "c10d", dynamo=s.dynamo,
        use_fsdp=s.use_fsdp, fsdp=s.fsdp, rank_log_dir=s.log_dir)


#: Intel OpenMP's thread placement for a CPU worker (GNU OpenMP ignores them), as
#: ``accelerate launch --cpu`` sets them.
INTEL_OPENMP = {"KMP_AFFINITY": "granularity=fine,compact,1,0", "KMP_BLOCKTIME": "1"}


def worker_env(settings: LaunchSettings) -> dict[str, str]:
    """``ACCEL_*`` (and thread/GPU) variables the workers inherit.

    With the CPU chosen explicitly (``--cpu``, ``ACCEL_DEVICE=cpu``, a config file's
    ``use_cpu``/``MULTI_CPU``) and one process per machine, also :data:`INTEL_OPENMP` (pin the
    threads compactly, spin 1 ms): several processes on one machine would pin their threads
    to the same cores, so they get none.
    """
    env = worker_spec(settings).environment()
    if settings.device == "cpu" and settings.explicit("device") and settings.nproc_per_node == 1:
        env.update(INTEL_OPENMP)
    return env


def _quiet_torch_logs(debug: bool, *, roles: Mapping[int, str] | None) -> None:
    """Replace torchelastic's per-worker ERROR lines by our report, and announce restarts with
    the root cause of the attempt being restarted (torchelastic logs neither)."""
    # Lazy (LAUNCH_LAZY_USES in tests/unit/test_architecture.py): the probe of torchelastic's
    # log record and frames lives with the other probes of torch internals, pinned there.
    from ..distributed.health.elastic import Restart, quiet_agent_logs

    def notice(restart: Restart) -> None:
        failed = extract_failures(restart.failures) if restart.failures else []
        if failed:
            print(format_failure_report(failed, roles=roles), file=sys.stderr, flush=True)
        print(f"accel launch: restarting all workers after the failure above, restart "
              f"{restart.number} of {restart.total} (--max_restarts; state {restart.state})",
              file=sys.stderr, flush=True)

    quiet_agent_logs(notice, debug=debug)


def _require_numa_binding() -> None:
    import importlib.util

    import torch

    try:
        found = importlib.util.find_spec("torch.numa.binding") is not None
    except ModuleNotFoundError:  # no torch.numa package at all
        found = False
    if not found:
        raise CLIError(f"--enable_cpu_affinity needs torchrun's --numa-binding, which PyTorch "
                       f"{torch.__version__} does not have; upgrade PyTorch or drop the flag")


def run_torchrun(argv: list[str], *, env: Mapping[str, str], debug: bool = False) -> int:
    """Run torchrun's agent in this process; print one ROOT CAUSE block on failure.

    Returns the exit code for ``accel launch``: 0, the root-cause rank's exit code (1 for a
    signal), or 128 + signal number when the launcher itself was interrupted.
    """
    import torch.distributed.run as torchrun  # heavy: imported only when launching
    from torch.distributed import DistError
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError

    if "--numa-binding" in argv:
        _require_numa_binding()
    apply({**env, **agent_environment(os.getpid())})  # the agent's workers inherit them
    layout = env.get(PS_LAYOUT_VARIABLE)
    roles = rank_roles(layout) if layout else None  # servers and workers, named in reports
    _quiet_torch_logs(debug, roles=roles)
    become_subreaper()
    try:
        torchrun.run(torchrun.parse_args(argv))
        return 0
    except ChildFailedError as exc:
        failures = extract_failures(exc.failures)
        print(format_failure_report(failures, roles=roles), file=sys.stderr, flush=True)
        code = root_failure(failures).exitcode
        return code if 0 < code < 256 else 1
    except SignalException as exc:
        print(f"accel launch: stopped by {exc.sigval.name}; all workers were terminated",
              file=sys.stderr, flush=True)
        return 128 + int(exc.sigval)
    except (RendezvousError, DistError) as exc:
        if debug:
            raise
        print(f"accel launch: rendezvous failed: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)
        return 1
    finally:
        reap_children()
