"""README.md stays true: every command in its ```bash blocks runs (here, or in another named
test), its Python blocks run, and the API names, flags and variables it mentions exist.

A command added to README without a test fails ``test_every_readme_command_is_exercised``.
"""

from __future__ import annotations

import importlib
import inspect
import re
import shlex
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import tomllib
import torch

from tests.e2e import test_examples
from tests.e2e.test_examples import ROOT, argv, clean_env, lines

README = ROOT / "README.md"
TIMEOUT = 240


# ---------------------------------------------------------------------------- README parsing
def readme() -> str:
    return README.read_text(encoding="utf-8")


def code_blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", readme(), re.MULTILINE | re.DOTALL)


def bash_commands() -> list[tuple[str, ...]]:
    """Every command of every ```bash block as words (continuations joined, comments dropped)."""
    commands = []
    for block in code_blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = tuple(shlex.split(line, comments=True))
            if words:
                commands.append(words)
    return commands


def words(*commands: str) -> set[tuple[str, ...]]:
    return {tuple(shlex.split(command)) for command in commands}


def train_py() -> str:
    """The Quick start's script: the python block right after "Save this as `train.py`"."""
    text = readme()
    start = text.index("Save this as `train.py`:")
    match = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL).search(text, start)
    assert match, "no python block after 'Save this as `train.py`'"
    return match.group(1)


# ---------------------------------------------------------------------------- command registry
INSTALL = "pip install torch==2.13.0 && pip install -e '.[{extra}]'"
#: the first set-up command: install, then run the example (test_examples runs it for real)
SETUP = INSTALL.format(extra="examples") + " && " + test_examples.DIGITS
EXTRA = "pip install -e '.[transformers]'"
#: the second set-up command, which .ci/run extracts and runs: install, then this very suite
TEST_COMMAND = INSTALL.format(extra="test") + " && python -m pytest -q tests"
QUICK_START = ("python train.py", "accel launch --cpu -n 2 train.py",
               "torchrun --nproc_per_node 2 train.py")
DIFF = "diff examples/digits_plain.py examples/digits.py"
TOOLS = ("accel launch --help", "accel config default", "accel env")
MULTI_NODE = tuple(
    f"accel launch --num_machines 2 --machine_rank {rank} --main_process_ip 10.0.0.1 "
    "--main_process_port 29500 -n 4 train.py" for rank in (0, 1))
MPIRUN = "mpirun -np 2 python train.py"

#: run by another test file (checked to exist below)
ELSEWHERE = {
    # merges a sharded checkpoint written by 2 FSDP processes (one file, and several + index)
    "accel merge-weights CHECKPOINT_DIR OUTPUT_DIR": (
        "tests/distributed/test_fsdp_checkpoint.py",
        "test_merge_weights_consolidates_without_a_process_group"),
    "accel merge-weights runs/fsdp_lm/checkpoints/checkpoint_1 merged/": (
        "tests/e2e/test_examples.py", "test_fsdp_lm_trains_sharded_saves_shards_and_resumes"),
    "accel test": ("tests/e2e/test_launch.py", "test_accel_test_self_check"),
    # disk-offloaded inference equal to the full model; the estimate of the same model
    "python examples/big_model_inference.py": (
        "tests/e2e/test_big_model_example.py",
        "test_disk_offloaded_inference_equals_the_full_model"),
    "accel estimate-memory examples/big_model_inference.py:build_model": (
        "tests/e2e/test_big_model_example.py", "test_estimate_memory_of_the_example_model"),
    # Horovod's examples with only the import changed (and the same numbers under mpirun)
    "accel launch --cpu -np 2 examples/horovod_mnist.py": (
        "tests/e2e/test_horovod_examples.py",
        "test_mnist_same_numbers_under_accel_launch_and_mpirun"),
    "accel launch --cpu -np 2 examples/horovod_synthetic_benchmark.py --num-iters 3": (
        "tests/e2e/test_horovod_examples.py",
        "test_synthetic_benchmark_under_accel_launch_and_mpirun"),
    # a worker dies at step 7; the restarted group resumes from the last commit
    "accel launch --cpu -n 2 --max_restarts 1 examples/horovod_elastic.py --fail_at_step 7": (
        "tests/e2e/test_horovod_elastic.py", "test_the_elastic_example_survives_a_lost_worker"),
    # a 1M-row table on a parameter server (smaller in the test), with its checkpoint shards
    "accel launch --cpu --server_num 1 --worker_num 2 examples/ctr_parameter_server.py": (
        "tests/e2e/test_ps.py", "test_ctr_example_runs_with_one_server_and_two_workers"),
    # converts a real Accelerate checkpoint (needs `accelerate`, in the test extra)
    "accel convert-checkpoint ACCELERATE_DIR OUT_DIR": (
        "tests/e2e/test_convert_checkpoint.py",
        "test_safetensors_checkpoint_converts_and_resumes_exactly"),
}

#: commands that cannot run on this machine, and how each is checked instead
NOT_HERE = {
    **{cmd: "needs two machines: test_multi_node_commands_resolve resolves the settings"
       for cmd in MULTI_NODE},
    MPIRUN: "needs MPI: run for real when mpirun is installed, else checked to wrap a command "
            "run here (test_mpirun_command); MPI detection is unit-tested with simulated envs",
    SETUP: "installs packages: test_setup_commands checks the pin and the extra, and "
           "test_examples runs the example it ends with",
    EXTRA: "installs packages: test_setup_commands checks the extra exists",
    TEST_COMMAND: "installs the test extra and runs this test suite (CI runs it from the "
                  "marker block); test_setup_commands checks the pin and the extra",
}


def test_every_readme_command_is_exercised() -> None:
    here = words(*QUICK_START, DIFF, *TOOLS)
    listed = here | words(*ELSEWHERE, *NOT_HERE)
    known = listed | words(*test_examples.COMMANDS)
    commands = bash_commands()
    missing = [" ".join(cmd) for cmd in commands if cmd not in known]
    assert not missing, f"README commands without a test: {missing}; add them to test_readme.py"
    stale = sorted(" ".join(cmd) for cmd in listed - set(commands))
    assert not stale, f"test_readme.py lists commands README no longer has: {stale}"
    for path, name in ELSEWHERE.values():
        source = (ROOT / path).read_text(encoding="utf-8")
        assert f"def {name}(" in source, f"{path}::{name} is gone; run the command here instead"


def test_test_command_block_is_what_ci_runs() -> None:
    block = re.search(r"<!-- test-command -->\n```bash\n(.*?)```\n<!-- /test-command -->",
                      readme(), re.DOTALL)
    assert block and block.group(1).strip() == TEST_COMMAND


def test_setup_commands() -> None:
    for command in (SETUP, TEST_COMMAND):
        pin = re.search(r"torch==([\d.]+)", command)
        assert pin and torch.__version__.split("+")[0] == pin.group(1)
    assert test_examples.DIGITS in test_examples.COMMANDS  # the example part runs for real
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert "scikit-learn" in extras["examples"] and "transformers" in extras["transformers"]
    # the test command installs only `.[test]`: it must bring what every test needs
    needed = {"pytest", "pyyaml", "scikit-learn", "tensorboard", "nbclient", "ipykernel", "ruff",
              "mypy", "wandb", "mlflow-skinny", "comet-ml", "aim", "pillow", "matplotlib"}
    have = {re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0].lower() for req in extras["test"]}
    assert needed <= have, f"the test extra lacks {sorted(needed - have)}"
    listed = re.search(r"^Optional extras: (.*?)\n\n", readme(), re.MULTILINE | re.DOTALL)
    assert listed, "README's 'Optional extras:' paragraph is gone"
    named = re.findall(r"'\.\[(\w+)\]'", readme()) + re.findall(r"`(\w+)`", listed.group(1))
    assert set(named) >= {"examples", "yaml", "tensorboard", "transformers", "xla", "test"}
    for name in named:
        assert name in extras, f"README names the extra {name!r}; pyproject has {sorted(extras)}"
    import accel

    assert metadata.version("accel") == accel.__version__  # `pip install -e .` was run


# ---------------------------------------------------------------------------- running commands
def run(command: str, cwd: Path, *, ok: tuple[int, ...] = (0,)) -> tuple[str, str]:
    words = shlex.split(command)
    cmd = words if words[0] == "diff" else argv(command)
    proc = subprocess.run(cmd, cwd=cwd, env=clean_env(cwd), capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert proc.returncode in ok, f"{command!r} exited {proc.returncode}:\n{proc.stdout}\n" \
        f"{proc.stderr}"
    return proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def quick_start(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("quick_start")
    (root / "train.py").write_text(train_py())
    return root


@pytest.mark.slow
@pytest.mark.parametrize("command", QUICK_START)
def test_quick_start(command: str, quick_start: Path) -> None:
    weights = quick_start / "model.safetensors"
    weights.unlink(missing_ok=True)
    out, _err = run(command, quick_start)
    assert len(lines(out, "epoch 2: loss ")) == 1, out  # printed once, whatever the launcher
    found = lines(out, "mean absolute error ")
    assert len(found) == 1 and found[0].endswith(" over 101 samples"), out
    from accel import load

    assert sorted(load(weights)) == ["bias", "weight"]


def test_mpirun_command() -> None:
    words = shlex.split(MPIRUN)
    assert words[:3] == ["mpirun", "-np", "2"] and " ".join(words[3:]) in QUICK_START
    if shutil.which("mpirun") is None:
        return  # the wrapped command runs in test_quick_start; detection: tests/unit/env/test_env.py
    out = subprocess.run(words, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr


def test_diff_shows_what_accel_changes(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    out, _err = run(DIFF, tmp_path, ok=(1,))  # diff exits 1 when the files differ
    assert "> from accel import Accelerator" in out
    assert re.search(r"^<\s+dist\.init_process_group\(", out, re.MULTILINE), out


@pytest.mark.slow
def test_accel_tools(tmp_path: Path) -> None:
    out, _err = run("accel launch --help", tmp_path)
    for flag in re.findall(r"^\| `(-[^`]*)`", readme(), re.MULTILINE):
        for spelling in re.findall(r"--?[a-z_]+", flag):
            assert spelling in out, f"README documents {spelling} but `accel launch --help` " \
                "does not list it"
    out, err = run("accel config default", tmp_path)
    written = tmp_path / "xdg" / "accel" / "default_config.yaml"  # clean_env's XDG_CONFIG_HOME
    assert written.is_file(), out + err
    out, _err = run("accel env", tmp_path)
    assert f"config file: {written}" in out, out
    assert "- accel: " in out and "- torch: " in out


def test_multi_node_commands_resolve() -> None:
    from accel.launch import cli
    from accel.launch.settings import resolve_settings

    for rank, command in enumerate(MULTI_NODE):
        args = cli.build_parser().parse_args(shlex.split(command)[1:])
        flags = {k: v for k, v in vars(args).items() if k != "command"}
        settings = resolve_settings(flags, environ={}, config=None, gpu_count=lambda: 2, cpu_count=8,
                                    run_id="r", is_local_address=lambda ip: False)
        assert (settings.num_machines, settings.machine_rank, settings.num_processes) == \
            (2, rank, 4)
        assert settings.main_process_ip == "10.0.0.1" and settings.main_process_port == 29500
        assert any("unauthenticated" in w for w in settings.warnings)
    paddle = re.search(r"`accel launch (--ips [^`]*)`", readme())
    assert paddle, "the Paddle table's accel launch --ips command is gone"
    args = cli.build_parser().parse_args(["launch", *shlex.split(paddle.group(1))])
    flags = {k: v for k, v in vars(args).items() if k != "command"}
    settings = resolve_settings(flags, environ={}, config=None, gpu_count=lambda: 2, cpu_count=8, run_id="r",
                                is_local_address=lambda ip: ip == "10.0.0.2")
    assert (settings.num_machines, settings.machine_rank, settings.main_process_ip) == \
        (2, 1, "10.0.0.1")


# ---------------------------------------------------------------------------- python blocks
def test_python_blocks_compile() -> None:
    for block in code_blocks("python"):
        compile(block, "README.md", "exec")


@pytest.mark.slow
def test_checkpoint_and_logging_blocks_run(tmp_path: Path) -> None:
    blocks = [b for b in code_blocks("python") if "ProjectConfiguration(" in b
              or "init_trackers(" in b]
    assert len(blocks) == 2
    script = "\n".join(f"exec(compile({b!r}, 'README block {i}', 'exec'), {{}})"
                       for i, b in enumerate(blocks))
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=clean_env(tmp_path),
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "runs" / "exp1" / "checkpoints" / "checkpoint_0" / "manifest.json"
            ).is_file()
    metrics = (tmp_path / "runs" / "exp1" / "metrics.jsonl").read_text().splitlines()
    assert metrics == ['{"step": 0, "loss": 1.0}', '{"step": 1, "loss": 0.5}',
                       '{"step": 2, "loss": 0.3333333333333333}']
    assert "printed by the main process only" in proc.stderr
    assert "[rank 0] printed by every process" in proc.stderr
    assert "print, on the main process only" in proc.stdout


# ---------------------------------------------------------------------------- names in prose
def test_imports_in_readme_work() -> None:
    statements = re.findall(r"from accel(?:\.[\w.]+)? import [\w, ]+", readme())
    assert len(statements) > 5
    for statement in statements:
        exec(statement, {})


def test_accelerator_names_in_readme_exist() -> None:
    import accel
    from accel import Accelerator

    text = readme()
    for name in set(re.findall(r"accelerator\.(\w+)", text)):
        assert hasattr(Accelerator, name), f"README uses accelerator.{name}"
    from accel.compat.refusals import LEGACY_ARGUMENTS

    # raising, or Accelerate's older arguments taken outside the signature (split_batches)
    documented_as_raising = {"deepspeed_plugin", *LEGACY_ARGUMENTS}
    for callee in ("Accelerator", "notebook_launcher", "ProjectConfiguration",
                   "DataLoaderConfiguration", "get_logger", "find_executable_batch_size"):
        params = inspect.signature(getattr(accel, callee)).parameters
        for call in re.findall(rf"\b{callee}\(([^()]*)\)", text):
            for name in set(re.findall(r"(\w+)=", call)) - documented_as_raising:
                assert name in params, f"README calls {callee}({name}=...)"
    for dotted in set(re.findall(r"`(accel\.[\w.]+)", text)):
        _resolve(dotted)


def _resolve(dotted: str) -> object:
    parts = dotted.split(".")
    obj: object = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = importlib.import_module(".".join(parts[:i + 1]))
    return obj


def test_environment_variables_table_matches_accel_env() -> None:
    from accel.env import ACCEL_VARIABLES

    text = readme()
    table = set(re.findall(r"^\| `(ACCEL_\w+)` \|", text, re.MULTILINE))
    assert table == set(ACCEL_VARIABLES)
    source = "".join(path.read_text(encoding="utf-8")
                     for path in sorted((ROOT / "accel" / "env").glob("*.py")))
    for name in set(re.findall(r"\bACCEL_[A-Z_]+\b", text)) - {"ACCEL_DEBUG"}:
        assert name in ACCEL_VARIABLES or f'"{name}"' in source, f"README names {name}"


def test_unsupported_accelerate_arguments_raise_as_documented() -> None:
    from accel import Accelerator

    for name in ("deepspeed_plugin", "fsdp_plugin", "dispatch_batches", "even_batches"):
        with pytest.raises(TypeError, match=name):
            Accelerator(cpu=True, **{name: object()})
    with pytest.warns(FutureWarning, match="split_batches"):  # taken, as in Accelerate
        assert Accelerator(cpu=True, split_batches=True).split_batches  # type: ignore[call-arg]
