"""Chaos drill, short form: 3 SIGKILLs of random ranks of a checkpointing 2-process job.

The long form is ``python benchmarks/chaos_drill.py --kills 20`` (same code, more kills). The
job (``benchmarks/_chaos_train.py``) saves every 5 steps with ``total_limit=2`` and starts with
``load_state(missing_ok=True)``; ``accel launch --max_restarts 3`` restarts it after each kill.
One kill is aimed inside a save, one at ``load_state`` of a restarted attempt and one at a
random step, in an order and at moments picked by a seeded random generator: the seed is
printed, and ``ACCEL_CHAOS_SEED=<n>`` (read by this test only) replays a run. Run with
``-s`` to see the figures (kills, restarts, lost work, wall time).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.procscan import with_marker

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the drill reads /proc and kills with SIGKILL")


def _drill_module() -> Any:
    sys.path.insert(0, str(BENCH))
    try:
        import chaos_drill
    finally:
        sys.path.remove(str(BENCH))
    return chaos_drill


@pytest.mark.slow
def test_random_sigkills_during_training_and_saves_end_bit_identical(tmp_path: Path) -> None:
    drill = _drill_module()
    seed = int(os.environ.get(drill.SEED_ENV, "") or 20261125)
    print(f"\nchaos drill seed {seed} (replay: {drill.SEED_ENV}={seed})",
          flush=True)
    result = drill.run_drill(tmp_path, kills=3, seed=seed, steps=60,
                             save_every=5, total_limit=2, workers=1, parallel=True,
                             timeout=240.0, modes=("save", "step", "load"))
    print(result.report(), flush=True)
    assert len(result.kills) == 3, result.output
    assert result.code == 0, result.output
    assert result.restarts == 3, result.output  # one per kill, none for anything else
    assert result.output.count("ROOT CAUSE") == 3 and "SIGKILL" in result.output
    assert result.identical, result.differences  # torch.equal on every tensor
    assert result.leftover_processes == [] and with_marker(str(tmp_path)) == []
    assert result.stray_entries == []
    checkpoints = sorted(p.name for p in (tmp_path / "chaos" / "project" / "checkpoints")
                         .iterdir())
    assert len(checkpoints) <= 2 and all(n.startswith("checkpoint_") for n in checkpoints)
    assert result.steps_executed >= result.steps_needed == 60
    assert sorted(k.mode for k in result.kills) == ["load", "save", "step"]
    assert result.ok
