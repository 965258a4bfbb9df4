"""``save_on_each_node``: the decisions about copies, in one process.

Where each machine's copy goes and who writes it (:mod:`accel.checkpoint.protocol.copies`),
what cannot be copied (FSDP), how a failed copy withdraws the others, how ``load_state``'s ranks
agree on their copies, and the flag through the ``Accelerator`` in one process. The real thing,
two machines without a shared filesystem: tests/distributed/test_save_on_each_node.py.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from accel.checkpoint import CheckpointError, CheckpointWriter, is_complete, read_manifest
from accel.checkpoint.protocol import copies, seal
from accel.checkpoint.protocol.load import _agree_on_copies


def _plan(targets: list[tuple[int, str]], *, machine: int = 0, mine: int | None = 0,
          each_node: bool = True) -> copies.SavePlan:
    return copies.SavePlan(
        copies=tuple(copies.Copy(writer=w, target=Path(t), token=f"t{w}") for w, t in targets),
        machine=machine, mine=mine, blocking=True, each_node=each_node)


def test_machines_agree_on_the_automatic_name_and_keep_their_own_directories() -> None:
    proposals = [("a/checkpoints", 3, "t0"), None, ("b/checkpoints", 5, "t2"), None]
    made = copies._copies(proposals)
    assert [(c.writer, c.target.as_posix(), c.token) for c in made] == \
        [(0, "a/checkpoints/checkpoint_5", "t0"), (2, "b/checkpoints/checkpoint_5", "t2")]
    explicit = copies._copies([("out0", None, "t0"), ("out1", None, "t1")])
    assert [c.target.as_posix() for c in explicit] == ["out0", "out1"]


def test_each_rank_belongs_to_its_machines_local_main_process() -> None:
    made = copies._copies([("a", None, "t0"), None, ("b", None, "t2"), None])
    layout = [(0, "h"), (0, "h"), (1, "h"), (1, "h")]  # 2 machines simulated on one host
    assert copies._machines(layout, made) == [0, 0, 1, 1]
    by_host = [(0, "x"), (0, "y"), (0, "x"), (0, "y")]  # mpirun round robin: node ranks derived
    assert copies._machines(by_host, copies._copies(
        [("a", None, "t0"), ("b", None, "t1"), None, None])) == [0, 1, 0, 1]
    with pytest.raises(CheckpointError, match=r"have 2 local main processes \(local rank 0: "
                                              r"\[0, 1\]\)"):
        copies._machines([(0, "h"), (0, "h")], copies._copies([("a", None, "t0"),
                                                                ("b", None, "t1")]))


def test_a_plan_knows_who_writes_what() -> None:
    plan = _plan([(0, "a/ckpt"), (2, "b/ckpt")], machine=1, mine=1)
    assert plan.target == Path("b/ckpt") and plan.tmpdir == Path("b/.tmp-ckpt-t2")
    assert plan.writes_shared(2) and not plan.writes_shared(3)
    assert plan.active([0, 0, 1, 1]) == [0, 1]
    assert plan.active([0, 0, 0, 0]) == [0]  # machine 1 shares machine 0's directory
    assert plan.save_id == "t0"
    shared = _plan([(0, "a/ckpt"), (2, "a/ckpt")], machine=1, mine=0)  # it saw t0's directory
    assert shared.tmpdir == Path("a/.tmp-ckpt-t0") and not shared.writes_shared(2)


def test_fsdp_state_is_refused_where_no_copy_could_be_complete() -> None:
    two = _plan([(0, "a"), (2, "b")])
    assert copies.refusal(two, mines=[0, 0, 1, 1], distributed=False, sharded=False) is None
    for sharded in (True, False):
        error = copies.refusal(two, mines=[0, 0, 1, 1], distributed=True, sharded=sharded)
        assert error is not None and "2 copies" in str(error) and "save_model" in str(error)
        # a directory every machine shares: one copy, rank 0's
        assert copies.refusal(two, mines=[0, 0, 0, 0], distributed=True, sharded=sharded) is None
    plain = _plan([(0, "ckpt")], each_node=False)
    unseen = copies.refusal(plain, mines=[0, None], distributed=True, sharded=True)
    assert unseen is not None and "ranks [1] do not see ckpt" in str(unseen)
    # FULL_STATE_DICT: the main process holds all of it, the other ranks hand over their states
    assert copies.refusal(plain, mines=[0, None], distributed=True, sharded=False) is None


def test_the_main_process_says_once_that_other_machines_have_no_checkpoint() -> None:
    plain = _plan([(0, "ckpt")], each_node=False)
    assert copies.unseen_note(plain, [0, 0]) is None
    note = copies.unseen_note(plain, [0, 0, None, None])
    assert note is not None and "ranks [2, 3] do not see ckpt" in note
    assert "save_on_each_node=True" in note
    assert copies.unseen_note(_plan([(0, "a"), (2, "b")]), [0, 0, None, 1]) is None


def _complete(target: Path) -> Path:
    writer = CheckpointWriter(target)
    writer.write_tensors("model_0.safetensors", {"w": torch.ones(2)})
    return writer.finalize(step=1, world_size=2)


def test_a_copy_is_withdrawn_when_another_machine_could_not_seal_its_own(tmp_path: Path
                                                                        ) -> None:
    target = _complete(tmp_path / "checkpoints" / "checkpoint_3")
    plan = _plan([(0, str(target)), (1, "elsewhere/checkpoint_3")])
    failed = CheckpointError("machine 1: disk full")
    error = seal._seal_copies(lambda obj: [obj[0], failed], plan=plan, writing=0, error=None, limit=None, keep=[])
    assert error is failed and not target.exists()


def test_copies_rotate_only_once_every_machine_sealed(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    old = [_complete(root / f"checkpoint_{n}") for n in range(3)]
    plan = _plan([(0, str(old[-1])), (1, "elsewhere/checkpoint_2")])
    assert seal._seal_copies(lambda obj: [obj[0], None], plan=plan, writing=0, error=None, limit=2, keep=[]) is None
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint_1", "checkpoint_2"]
    rotated = CheckpointError("machine 1: rotation failed")
    assert seal._seal_copies(lambda obj: [obj[0], rotated], plan=plan, writing=0, error=None, limit=2, keep=[]) is rotated


def test_load_state_ranks_agree_on_their_machines_copies() -> None:
    _agree_on_copies(["a/checkpoint_2", "b/checkpoint_2"], newest=True)
    _agree_on_copies([None, None], newest=True)  # nothing yet, anywhere (missing_ok)
    _agree_on_copies(["a/x", "b/y"], newest=False)  # input_dir as each rank was given it
    with pytest.raises(CheckpointError, match=r"rank 0: checkpoint_2; rank 1: none"):
        _agree_on_copies(["a/checkpoint_2", None], newest=True)
    with pytest.raises(CheckpointError, match="a save did not reach every machine"):
        _agree_on_copies(["a/checkpoint_2", "b/checkpoint_1"], newest=True)


def test_one_process_saves_and_loads_with_the_flag(tmp_path: Path) -> None:
    from accel import Accelerator, ProjectConfiguration

    acc = Accelerator(cpu=True, project_config=ProjectConfiguration(
        project_dir=str(tmp_path / "proj"), total_limit=1, save_on_each_node=True))
    model = acc.prepare(torch.nn.Linear(2, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        acc.save_state()
        path = Path(acc.save_state(blocking=False))
        assert acc.wait_for_checkpoint() == str(path)
    assert path.name == "checkpoint_1" and is_complete(path)
    assert sorted(p.name for p in path.parent.iterdir()) == ["checkpoint_1"]
    assert read_manifest(path).meta["save_id"]
    with torch.no_grad():
        model.weight.zero_()
    assert acc.load_state() == str(path) and float(model.weight.detach().abs().sum()) > 0
    acc.save_model(model, str(tmp_path / "model"))
    acc.save({"w": torch.ones(1)}, str(tmp_path / "w.safetensors"))
    assert (tmp_path / "model" / "model.safetensors").is_file()
    assert (tmp_path / "w.safetensors").is_file()
