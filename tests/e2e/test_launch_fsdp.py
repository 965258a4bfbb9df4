"""``accel launch --use_fsdp`` as a subprocess: two CPU workers build the FSDP plugin from the
launch flags and shard a model with it."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.e2e.test_launch import finish, launch, results

pytestmark = pytest.mark.slow

SCRIPT = """\
    import json

    import torch
    from torch import nn

    from accel import Accelerator
    from torch.distributed.fsdp import FSDPModule


    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x)


    accelerator = Accelerator()
    model = accelerator.prepare(nn.Sequential(Block(), Block(), nn.Linear(4, 1)))
    loss = model(torch.ones(2, 4)).sum()
    accelerator.backward(loss)
    plugin = accelerator.state.fsdp_plugin
    print("RESULT " + json.dumps({
        "rank": accelerator.process_index,
        "distributed_type": str(accelerator.distributed_type.value),
        "wrap": plugin.auto_wrap_policy, "classes": plugin.transformer_cls_names_to_wrap,
        "reshard": plugin.reshard_after_forward, "state_dict_type": plugin.state_dict_type,
        "units": sum(isinstance(m, FSDPModule) for m in model.modules()),
    }), flush=True)
    """


def test_launch_use_fsdp_builds_the_plugin_in_every_worker(tmp_path: Path) -> None:
    (tmp_path / "fsdp_script.py").write_text(textwrap.dedent(SCRIPT))
    code, out, err = finish(launch(
        ["--cpu", "--num_processes", "2", "--use_fsdp", "--fsdp_auto_wrap_policy",
         "TRANSFORMER_BASED_WRAP", "--fsdp_transformer_layer_cls_to_wrap", "Block",
         "--fsdp_reshard_after_forward", "false", "fsdp_script.py"], tmp_path))
    assert code == 0, err
    rows = results(out)
    assert sorted(rows) == [0, 1]
    for row in rows.values():
        assert {key: value for key, value in row.items() if key != "rank"} == {
            "distributed_type": "FSDP", "wrap": "transformer_based_wrap", "classes": ["Block"],
            "reshard": False, "state_dict_type": "SHARDED_STATE_DICT", "units": 3}, json.dumps(row)
    assert "use_fsdp" in err and "flag --fsdp_auto_wrap_policy" in err  # the settings table
