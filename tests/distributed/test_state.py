"""PartialState and accelerator.state in two real processes (one spawn checks everything)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.spawn import run_workers


def _ordered(state: Any, marker: Path) -> bool | None:
    """Inside ``main_process_first``: the main process writes ``marker`` late; the others must
    find it already there (they entered after the main process left)."""
    with state.main_process_first():
        if state.is_main_process:
            time.sleep(0.5)
            marker.write_text("main was here")
            return None
        return marker.exists()


def _process_control(state: Any, tmp: Path, tag: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "who": (state.process_index, state.local_process_index, state.num_processes,
                state.is_main_process, state.is_last_process, state.use_distributed,
                state.distributed_type.value, state.backend),
        "after_main": _ordered(state, tmp / f"{tag}_first"),
    }
    with state.split_between_processes(list(range(5)), apply_padding=True) as part:
        out["padded"] = part
    with state.split_between_processes({"x": list(range(5))}) as part:
        out["split"] = part
    state.wait_for_everyone()
    out["on_main"] = state.on_main_process(lambda: "ran")()
    out["on_1"] = state.on_process(process_index=1)(lambda: "ran")()
    out["on_last"] = state.on_last_process(lambda: "ran")()
    return out


def _worker(rank: int, tmp: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from accel import Accelerator, PartialState

    out: dict[str, Any] = {}
    state = PartialState(cpu=True)
    out["started"] = dist.is_initialized() and state._process.group.owned
    again = PartialState(cpu=True)
    out["agree"] = (again.process_index, again.num_processes, again._process.group.owned) == \
        (state.process_index, state.num_processes, False)
    out["partial"] = _process_control(state, Path(tmp), "partial")
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    out["adopted"] = not accelerator._rt.group.owned and dist.is_initialized()
    out["acc_state"] = _process_control(accelerator.state, Path(tmp), "acc_state")
    out["mixed"] = accelerator.state.mixed_precision
    # the Accelerator's own block comes after the views' blocks: keys must not collide
    out["acc_first"] = _ordered(accelerator, Path(tmp) / "accelerator_first")
    out["gathered"] = accelerator.gather(torch.tensor([rank])).tolist()
    accelerator.end_training()  # adopted: the group stays
    out["kept"] = dist.is_initialized()
    state.destroy_process_group()
    out["destroyed"] = not dist.is_initialized()
    out["again"] = _built_again(rank)
    return out


def _built_again(rank: int) -> list[Any]:
    """Accelerators built one after another in the job, each ended with end_training() (which
    destroys the group it started); rank 0 comes late each time, so rank 1 looks up rank 0's
    address before rank 0 published the new one: it must not find the old group's."""
    import torch
    import torch.distributed as dist

    from accel import Accelerator

    rounds = []
    for step in range(3):
        if rank == 0:
            time.sleep(0.5)
        accelerator = Accelerator(cpu=True)
        owned = accelerator._rt.group.owned
        gathered = accelerator.gather(torch.tensor([rank + 10 * step])).tolist()
        accelerator.end_training()
        rounds.append((owned, gathered, dist.is_initialized()))
    return rounds


def test_partial_state_and_accelerator_state_on_two_ranks(tmp_path: Path) -> None:
    first, second = run_workers(_worker, 2, args=(str(tmp_path),), timeout=120)
    for rank, out in enumerate((first, second)):
        assert out["started"] and out["agree"] and out["adopted"], (rank, out)
        assert out["mixed"] == "bf16" and out["gathered"] == [0, 1]
        assert out["kept"] and out["destroyed"], (rank, out)
        # a group started after another was destroyed reads none of the old group's keys
        assert out["again"] == [(True, [0, 1], False), (True, [10, 11], False),
                                (True, [20, 21], False)], (rank, out["again"])
        assert out["acc_first"] == (None if rank == 0 else True)
        for view in ("partial", "acc_state"):
            got = out[view]
            assert got["who"] == (rank, rank, 2, rank == 0, rank == 1, True, "MULTI_CPU",
                                  "gloo"), (rank, view, got)
            assert got["after_main"] == (None if rank == 0 else True), (rank, view)
            assert got["padded"] == ([0, 1, 2] if rank == 0 else [3, 4, 4]), (rank, view)
            assert got["split"] == ({"x": [0, 1, 2]} if rank == 0 else {"x": [3, 4]})
            assert got["on_main"] == ("ran" if rank == 0 else None)
            assert got["on_1"] == ("ran" if rank == 1 else None)
            assert got["on_last"] == ("ran" if rank == 1 else None)
