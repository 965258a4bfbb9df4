"""The helpers Horovod's ``test_torch.py`` imports from its ``common`` module, written for accel.

Horovod's test files do ``from common import mpi_env_rank_and_size, temppath`` (and, in newer
versions, ``skip_or_fail_gpu_test``); ``common.py`` lives in Horovod's repository, not in the
sdist, so :mod:`tests.compat.horovod_suite` points that import here. ``LooseVersion`` stands in
for ``distutils.version.LooseVersion`` on Pythons without ``distutils`` (3.12+).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import unittest
from collections.abc import Iterator

from packaging.version import Version, parse

__all__ = ["LooseVersion", "mpi_env_rank_and_size", "skip_or_fail_gpu_test", "temppath"]


def mpi_env_rank_and_size() -> tuple[int, int]:
    """This process's rank and the job's size, from the launcher's environment.

    As Horovod's helper: MPICH's ``PMI_*`` or Open MPI's ``OMPI_COMM_WORLD_*`` variables; then
    (beyond Horovod's, which only knows MPI) torchrun's ``RANK``/``WORLD_SIZE``, which is what
    ``accel launch`` sets; ``(0, 1)`` outside any launcher.
    """
    for rank_var, size_var in (("PMI_RANK", "PMI_SIZE"),
                               ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                               ("RANK", "WORLD_SIZE")):
        rank, size = os.environ.get(rank_var), os.environ.get(size_var)
        if rank is not None and size is not None:
            return int(rank), int(size)
    return 0, 1


@contextlib.contextmanager
def temppath() -> Iterator[str]:
    """A path in a fresh temporary directory (removed afterwards); the file is not created."""
    with tempfile.TemporaryDirectory() as directory:
        yield os.path.join(directory, "temp_test_file")


def skip_or_fail_gpu_test(test: unittest.TestCase, message: str) -> None:
    """Skip a GPU test (fail it instead when ``HOROVOD_TEST_GPU=1`` says GPUs are expected)."""
    if int(os.environ.get("HOROVOD_TEST_GPU", "0")):
        test.fail(message)
    test.skipTest(message)


def LooseVersion(text: str) -> Version:
    """A comparable version (``torch.__version__`` such as ``2.4.0+cpu`` included)."""
    return parse(text)
