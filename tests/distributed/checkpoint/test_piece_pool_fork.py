"""The checkpoint piece thread pool in a forked child: a child that inherits the parent's pool
(whose threads did not survive the fork) still saves and loads (moved out of
tests/unit/checkpoint/test_checkpoint_pieces.py, which starts no processes)."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import torch

from accel.checkpoint import load_tensors, verify
from accel.checkpoint.storage import _io
from tests.unit.checkpoint.test_checkpoint_pieces import (  # noqa: F401 - fixture
    _save,
    _tensors,
    small_pieces,
)


def _child_saves_and_loads(root: str) -> None:
    _io.PIECE = 1000  # several pieces: the pool is used in the child
    ckpt = _save(Path(root) / "child")
    assert torch.equal(load_tensors(ckpt, "model.safetensors")["weight"], _tensors()["weight"])


def test_the_thread_pool_works_in_a_forked_child(tmp_path: Path, small_pieces: int  # noqa: F811
                                                  ) -> None:
    _save(tmp_path / "parent")  # the parent read and hashed pieces on threads
    proc = mp.get_context("fork").Process(target=_child_saves_and_loads, args=(str(tmp_path),))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0  # a child that inherited a pool without threads would hang
    verify(tmp_path / "child")
