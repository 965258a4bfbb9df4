"""``accel launch --mpirun_hostfile FILE --cpu``: start CPU workers with ``mpirun``.

Accelerate's multi-CPU launcher: ``mpirun`` (Open MPI) or ``mpirun``/``mpiexec`` of a Hydra MPI
(MPICH, Intel MPI, MVAPICH2) starts ``-n`` processes, ``--num_processes / --num_machines`` per
host of the hostfile. Each process runs accel's bootstrap, and ``Accelerator()`` reads its rank
from the MPI variables (``accel.env`` understands all four), so no torchrun agent is involved:
no restarts, no ROOT CAUSE report (mpirun prints the failing rank itself).

The rendezvous address is ``--main_process_ip`` when given, else the first host of the
hostfile (where MPI puts rank 0); the port is ``--main_process_port`` when given, else every
rank derives the same one from the MPI job id.

Example:
    >>> from accel.launch.settings import LaunchSettings
    >>> s = LaunchSettings(script="t.py", num_processes=4, python="python")
    >>> build_mpirun_argv(s, env={"A": "1"}, app="mpirun", flavour=OPENMPI, hostfile="hosts",
    ...                   master_addr="n1")[:8]
    ['mpirun', '--hostfile', 'hosts', '-n', '4', '--npernode', '4', '--bind-to']
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping

from ..env import apply
from .errors import CLIError
from .hosts import read_hostfile
from .settings import LaunchSettings
from .torchrun import worker_command

__all__ = ["HYDRA", "OPENMPI", "build_mpirun_argv", "first_host", "ignored_settings",
           "mpi_flavour", "mpirun_argv", "run_mpirun"]

OPENMPI = "openmpi"
#: MPICH, Intel MPI and MVAPICH2 share the Hydra process manager's options.
HYDRA = "hydra"


#: torchrun settings that mean nothing when mpirun starts the workers.
_TORCHRUN_ONLY = ("max_restarts", "monitor_interval", "rdzv_backend", "rdzv_conf", "tee",
                  "log_dir", "role", "enable_cpu_affinity", "machine_rank")


def ignored_settings(settings: LaunchSettings) -> list[str]:
    """A warning for each torchrun-only setting the user gave (mpirun has no agent)."""
    return [f"{name} ({settings.sources[name]}) is ignored: mpirun starts the workers, not "
            "torchrun's agent" for name in _TORCHRUN_ONLY if settings.explicit(name)]


def _version_text(app: str) -> str:
    done = subprocess.run([app, "--version"], capture_output=True, text=True, timeout=30,
                          check=False)
    return done.stdout + done.stderr


def mpi_flavour(which: Callable[[str], str | None] = shutil.which,
                version: Callable[[str], str] = _version_text) -> tuple[str, str]:
    """(path of mpirun or mpiexec, ``OPENMPI`` or ``HYDRA``) from ``<app> --version``."""
    app = next((path for name in ("mpirun", "mpiexec") if (path := which(name))), None)
    if app is None:
        raise CLIError("--mpirun_hostfile needs mpirun or mpiexec on PATH (Open MPI, MPICH, "
                       "Intel MPI or MVAPICH2); install one, or drop --mpirun_hostfile and start "
                       "`accel launch --cpu --num_machines N --machine_rank R ...` on each host")
    text = version(app)
    return app, OPENMPI if "Open MPI" in text or "OpenRTE" in text else HYDRA


def first_host(hostfile: str) -> tuple[str, int]:
    """(first host, number of hosts) of an Open MPI (``host slots=4``) or Hydra (``host:4``)
    hostfile."""
    hosts = read_hostfile(hostfile, "--mpirun_hostfile")
    return hosts[0].name, len(hosts)


def build_mpirun_argv(settings: LaunchSettings, *, env: Mapping[str, str], app: str, flavour: str,
                      hostfile: str, master_addr: str) -> list[str]:
    """The ``mpirun`` command line (a pure function): placement, the workers' environment
    (``-x`` for Open MPI, ``-genv`` for Hydra), then the worker command."""
    s = settings
    variables = {**env, "MASTER_ADDR": master_addr}
    if s.main_process_port:
        variables["MASTER_PORT"] = str(s.main_process_port)
    per_node, total = str(s.nproc_per_node), str(s.num_processes)
    if flavour == OPENMPI:
        # Socket binding: Open MPI's default for 2 processes or fewer pins each one to a
        # single core, which would starve its OMP_NUM_THREADS threads.
        argv = [app, "--hostfile", hostfile, "-n", total, "--npernode", per_node,
                "--bind-to", "socket"]
        for name, value in variables.items():
            argv += ["-x", f"{name}={value}"]
    else:
        argv = [app, "-f", hostfile, "-n", total, "-ppn", per_node]
        for name, value in variables.items():
            argv += ["-genv", name, value]
    return argv + worker_command(s)


def mpirun_argv(settings: LaunchSettings, env: Mapping[str, str]) -> list[str]:
    """The ``mpirun`` command line of these settings, with the installed MPI's flags.

    Raises:
        CLIError: no mpirun/mpiexec on PATH, or fewer hosts in the file than machines.
    """
    hostfile = str(settings.mpirun_hostfile)
    host, count = first_host(hostfile)
    if settings.num_machines > count:
        raise CLIError(f"--num_machines {settings.num_machines} but --mpirun_hostfile {hostfile} "
                       f"lists {count} host(s); list every machine or lower --num_machines")
    app, flavour = mpi_flavour()
    addr = settings.main_process_ip if settings.explicit("main_process_ip") else host
    return build_mpirun_argv(settings, env=env, app=app, flavour=flavour, hostfile=hostfile,
                             master_addr=addr)


def run_mpirun(settings: LaunchSettings, env: Mapping[str, str]) -> int:
    """Run the job under mpirun; returns mpirun's exit code."""
    argv = mpirun_argv(settings, env)
    for warning in ignored_settings(settings):
        print(f"accel launch: warning: {warning}", file=sys.stderr)
    apply(env)  # local ranks inherit them too
    return subprocess.call(argv)
