"""Accelerate's ``tpu-config`` and ``estimate-memory`` commands under accel."""

from __future__ import annotations

from pathlib import Path

import pytest

from accel.commands.estimate import (
    add_timm_hub_prefix,
    estimate_command,
    estimate_command_parser,
)
from accel.commands.tpu import tpu_command_launcher, tpu_command_parser
from accel.compat.refusals import NotSupportedError

GCLOUD = "Running gcloud compute tpus tpu-vm ssh"


@pytest.fixture(autouse=True)
def _no_default_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ACCEL_CONFIG_FILE", raising=False)  # no default config file
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config_home"))


def test_tpu_config_prints_the_gcloud_command(capsys: pytest.CaptureFixture[str]) -> None:
    parser = tpu_command_parser()
    base = ["--tpu_zone", "zone-a", "--tpu_name", "pod", "--debug"]
    tpu_command_launcher(parser.parse_args(["--command", "ls", "--command", "echo", "hi",
                                            *base]))
    assert capsys.readouterr().out == (f"{GCLOUD} pod --zone zone-a --command cd /usr/share; ls; "
                                       "echo hi --worker all\n")
    tpu_command_launcher(parser.parse_args(["--command", "ls", "--install_accelerate",
                                            "--accelerate_version", "1.2.0", "--use_alpha",
                                            *base]))
    assert "gcloud alpha compute" in (out := capsys.readouterr().out)
    assert "cd /usr/share; pip install accelerate==1.2.0; ls --worker" in out


def test_tpu_config_reads_the_config_file_and_never_runs_gcloud(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    commands = tmp_path / "cmds.sh"
    commands.write_text("echo one\necho two\n")
    config = tmp_path / "c.yaml"
    config.write_text(f"distributed_type: XLA\ntpu_name: pod\ntpu_zone: z\n"
                      f"command_file: {commands}\n")
    parser = tpu_command_parser()
    tpu_command_launcher(parser.parse_args(["--config_file", str(config), "--debug"]))
    assert f"{GCLOUD} pod --zone z --command cd /usr/share; echo one; echo two --worker all" in \
        capsys.readouterr().out
    with pytest.raises(NotSupportedError, match="does not run gcloud: pass --debug"):
        tpu_command_launcher(parser.parse_args(["--config_file", str(config)]))
    with pytest.raises(ValueError, match="--tpu_name and --tpu_zone"):
        tpu_command_launcher(parser.parse_args(["--command", "ls", "--debug"]))


def test_timm_hub_prefix_only_for_repo_ids() -> None:
    assert add_timm_hub_prefix("resnet50") == "resnet50"
    assert add_timm_hub_prefix("timm/resnet50.a1_in1k") == "hf-hub:timm/resnet50.a1_in1k"
    assert add_timm_hub_prefix("local-dir:/m") == "local-dir:/m"


def test_estimate_refuses_hub_ids_and_estimates_local_models(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    parser = estimate_command_parser()
    with pytest.raises(OSError, match="Hub repo id: accel does not fetch models"):
        estimate_command(parser.parse_args(["meta-llama/Llama-2-7b-hf"]))
    spec = tmp_path / "model.py"
    spec.write_text("import torch\ndef build():\n    return torch.nn.Linear(10, 10)\n")
    estimate_command(parser.parse_args([f"{spec}:build", "--dtypes", "float32"]))
    out = capsys.readouterr().out
    assert "float32" in out and "float16" not in out
    with pytest.raises(ValueError, match="float32, bfloat16 and float16 only"):
        estimate_command(parser.parse_args([f"{spec}:build", "--dtypes", "int8"]))
    with pytest.raises(ValueError, match="did not build a model"):
        estimate_command(parser.parse_args([f"{spec}:missing"]))
