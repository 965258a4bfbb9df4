"""An ``Accelerator`` travels into DataLoader workers started with ``spawn`` (Accelerate's does).

Datasets and collate functions often capture the accelerator (for ``process_index`` or the
device); with the ``spawn``/``forkserver`` start methods the worker receives a pickled copy. The
copy knows its process and settings; its process-group handles, stall monitor and trackers stay
behind (a copy cannot use them in another process).
"""

from __future__ import annotations

import pickle
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from tests.spawn import run_workers


class _TaggedByRank(Dataset[tuple[int, int]]):
    def __init__(self, accelerator: Any) -> None:
        self.accelerator = accelerator

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> tuple[int, int]:
        return index, self.accelerator.process_index


def _worker(rank: int) -> dict[str, Any]:
    import multiprocessing

    from accel import Accelerator

    # tests.spawn starts daemonic children, which may not start DataLoader workers (as in
    # test_data_sharding): this child waits for its workers itself.
    multiprocessing.current_process().daemon = False

    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    model = accelerator.prepare(torch.nn.Linear(2, 1))
    copy = pickle.loads(pickle.dumps(accelerator))
    loader = DataLoader(_TaggedByRank(accelerator), batch_size=2, num_workers=1,
                        multiprocessing_context="spawn")
    tags = sorted({int(r) for _, ranks in loader for r in ranks})
    twin = pickle.loads(pickle.dumps(model))  # a prepared (autocast) model pickles too
    x = torch.ones(1, 2)
    same = torch.equal(twin(x), model(x)) and twin(x).dtype == torch.float32
    accelerator.wait_for_everyone()  # the original still works after being pickled
    accelerator.end_training()
    return {"copy": (copy.process_index, copy.num_processes, copy.mixed_precision,
                     str(copy.device)), "tags": tags, "same": same}


def test_accelerator_pickles_into_spawned_dataloader_workers() -> None:
    rank0, rank1 = run_workers(_worker, 2, timeout=150)
    assert rank0["copy"] == (0, 2, "bf16", "cpu") and rank1["copy"] == (1, 2, "bf16", "cpu")
    assert rank0["tags"] == [0] and rank1["tags"] == [1]  # each worker saw its rank's copy
    assert rank0["same"] and rank1["same"]
