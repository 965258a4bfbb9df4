"""What this "build" supports, with Horovod's query names and return types.

accel.horovod has no build of its own: it runs on the installed torch.distributed, so the
answers describe torch's backends. MPI is never used (``mpirun`` only starts the processes),
so the MPI queries answer False; ``nccl_built()`` returns NCCL's version code (as Horovod's
``NCCL_VERSION_CODE``, e.g. 22105 for 2.21.5) or 0. The ``*_enabled`` and
``mpi_threads_supported`` queries describe the running job and need ``hvd.init()`` first, as
in Horovod.

``start_timeline`` / ``stop_timeline`` (Horovod's activity timeline) are accepted and do
nothing but warn once: use ``torch.profiler`` for a trace of the collectives.

Example:
    >>> import accel.horovod as hvd
    >>> hvd.mpi_built(), hvd.ddl_built(), hvd.ccl_built()
    (False, False, False)
    >>> hvd.gloo_built()
    True
    >>> hvd.init(); hvd.gloo_enabled(), hvd.mpi_enabled(); hvd.shutdown()
    (True, False)
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .._base.warn import warn_user
from ._session import current

__all__ = ["ccl_built", "cuda_built", "ddl_built", "gloo_built", "gloo_enabled", "mpi_built",
           "mpi_enabled", "mpi_threads_supported", "nccl_built", "rocm_built", "start_timeline",
           "stop_timeline"]

_WARNED_TIMELINE = "horovod.warned_timeline"


def mpi_built() -> bool:
    """False: accel.horovod runs on torch.distributed, without MPI."""
    return False


def mpi_enabled() -> bool:
    """False: collectives never go through MPI (``mpirun`` may still start the job)."""
    current()
    return False


def mpi_threads_supported() -> bool:
    """False (no MPI); any thread may call the collectives that torch allows."""
    current()
    return False


def gloo_built() -> bool:
    """Whether torch.distributed has the gloo backend."""
    return bool(dist.is_available() and dist.is_gloo_available())


def gloo_enabled() -> bool:
    """Whether this job's collectives run on gloo."""
    return current().context.backend == "gloo"


def nccl_built() -> int:
    """NCCL's version code when torch has NCCL (major*10000 + minor*100 + patch), else 0."""
    if not (dist.is_available() and dist.is_nccl_available()):
        return 0
    version = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
    if isinstance(version, int):
        return version
    major, minor, patch = (tuple(version) + (0, 0, 0))[:3]
    return int(major) * 10000 + int(minor) * 100 + int(patch)


def ddl_built() -> bool:
    """False: IBM DDL is not used."""
    return False


def ccl_built() -> bool:
    """False: oneCCL is not used."""
    return False


def cuda_built() -> bool:
    """Whether the installed torch is built with CUDA."""
    return torch.version.cuda is not None


def rocm_built() -> bool:
    """Whether the installed torch is built with ROCm."""
    return getattr(torch.version, "hip", None) is not None


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Accepted for compatibility; records nothing (warns once): use ``torch.profiler``."""
    extras = current().extras
    if not extras.get(_WARNED_TIMELINE):
        extras[_WARNED_TIMELINE] = True
        warn_user(f"hvd.start_timeline({file_path!r}): accel.horovod has no Horovod "
                  "timeline; nothing is recorded. Use torch.profiler.profile() to trace "
                  "the collectives")


def stop_timeline() -> None:
    """Accepted for compatibility (see :func:`start_timeline`)."""
    current()
