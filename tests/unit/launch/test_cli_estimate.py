"""``accel estimate-memory MODEL_SPEC``: table and JSON for a model defined here, bad specs.

The model specs point at :func:`build_model` in this file (``path/to/file.py:function``) and at a
module written to a temporary directory (``package.module:function``).
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from accel.big_modeling.estimate import estimate_memory
from accel.launch import cli

HERE = Path(__file__).resolve()
SPEC = f"{HERE}:build_model"
WIDTH, DEPTH, VOCAB = 64, 3, 500


class _Model(nn.Module):
    _no_split_modules = ["Sequential"]  # read as transformers' attribute: blocks stay whole

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))
            for _ in range(DEPTH))
        self.register_buffer("position", torch.arange(16))  # int64, not converted
        self.frozen = nn.Parameter(torch.zeros(10), requires_grad=False)


def build_model() -> nn.Module:
    return _Model()


def build_huge() -> nn.Module:
    return nn.Sequential(*[nn.Linear(8192, 8192) for _ in range(16)])  # 4.3 GB in fp32


def not_a_model() -> int:
    return 3


PARAMS = VOCAB * WIDTH + DEPTH * (WIDTH * 4 * WIDTH + 4 * WIDTH + 4 * WIDTH * WIDTH + WIDTH)
TRAINABLE = PARAMS  # `frozen` (10) is counted in weights, not in training state
BLOCK = WIDTH * 4 * WIDTH + 4 * WIDTH + 4 * WIDTH * WIDTH + WIDTH


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["estimate-memory", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_gives_weights_and_adam_training_per_dtype(capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    code, out, err = _run(capsys, SPEC, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["model"] == SPEC and "activations are not included" in report["note"]
    rows = {row["dtype"]: row for row in report["estimates"]}
    assert list(rows) == ["float32", "bfloat16", "float16"]
    fp32, bf16 = rows["float32"], rows["bfloat16"]
    assert fp32["parameters"] == PARAMS + 10
    assert fp32["total_bytes"] == (PARAMS + 10) * 4 + 16 * 8 == fp32["inference_bytes"]
    assert bf16["total_bytes"] == (PARAMS + 10) * 2 + 16 * 8  # the int64 buffer stays 8 bytes
    # fp32: weights + grads (4) + two fp32 moments (8); no master copy
    assert fp32["training_bytes"] == fp32["total_bytes"] + 12 * TRAINABLE
    assert fp32["master_weight_bytes"] == 0
    # bf16 mixed precision: + grads (2) + moments (8) + fp32 master weights (4)
    assert bf16["gradient_bytes"] == 2 * TRAINABLE and bf16["master_weight_bytes"] == 4 * TRAINABLE
    assert bf16["training_bytes"] == bf16["total_bytes"] + 14 * TRAINABLE
    # the largest layer is a whole block (a no-split class), not the embedding (500 x 64)
    assert (fp32["largest_layer"], fp32["largest_layer_bytes"]) == ("blocks.0", BLOCK * 4)


def test_table_lists_each_dtype_and_says_what_training_includes(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, SPEC, "--dtypes", "fp16", "float32")
    assert code == 0
    lines = out.splitlines()
    assert lines[1].split() == ["dtype", "largest", "layer", "total", "size", "inference",
                                "training", "(Adam)"]
    assert lines[2].startswith("float16 ") and lines[3].startswith("float32 ")
    assert "(blocks.0)" in lines[2] and "MiB" in lines[3]
    assert f"{PARAMS + 10:,} parameters" in out and "activations are not included" in out


def test_module_spec_from_the_current_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "zoo_models"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "small.py").write_text(textwrap.dedent("""\
        import torch
        def build():
            return torch.nn.Linear(1000, 1000)
        """))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    code, out, err = _run(capsys, "zoo_models.small:build", "--dtypes", "bf16", "--json")
    assert code == 0, err
    assert json.loads(out)["estimates"][0]["total_bytes"] == 1_001_000 * 2


def test_the_model_is_built_on_the_meta_device_without_allocating() -> None:
    statm = Path("/proc/self/statm")
    before = int(statm.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    rows = estimate_memory(build_huge, ["float32"])
    grown = int(statm.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") - before
    assert rows[0].total_bytes == 16 * (8192 * 8192 + 8192) * 4
    assert grown < 50 * 2**20, f"RSS grew by {grown} bytes"


@pytest.mark.parametrize(("spec", "message"), [
    ("no_such_package_xyz.models:build", "failed to import: ModuleNotFoundError"),
    ("just_a_name", "is not of the form package.module:function"),
    (f"{HERE.parent}/missing.py:build", "no file"),
    (f"{HERE}:no_such_function", "'no_such_function' is not defined there"),
    (f"{HERE}:WIDTH", "'WIDTH' is not callable"),
    (f"{HERE}:not_a_model", "returned int, not a torch.nn.Module"),
])
def test_bad_specs_are_one_line_errors(spec: str, message: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, spec)
    assert code == 2 and out == ""
    assert err.startswith("accel estimate-memory: error: ") and message in err
    assert len(err.strip().splitlines()) == 1


def test_a_spec_whose_import_fails_says_why(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\nfrom torch import no_such_name\n")
    code, _, err = _run(capsys, f"{broken}:build")
    assert code == 2 and "ImportError" in err and "no_such_name" in err


def test_unknown_dtype_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["estimate-memory", SPEC, "--dtypes", "float64"])
    assert info.value.code == 2
    assert "unknown dtype 'float64'; choose from float32, bfloat16, float16" in \
        capsys.readouterr().err


