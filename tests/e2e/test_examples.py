"""Every example in ``examples/`` run end to end, as the README shows it, through ``accel launch``.

The commands are module constants so that ``test_readme.py`` can check that each README command
is one that runs here. They run in a temporary copy of ``examples/`` (outputs land there).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.spawn import clean_env

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TIMEOUT = 240

DIGITS = "accel launch --cpu -n 2 examples/digits.py"
DIGITS_PLAIN_TORCHRUN = "torchrun --nproc_per_node 2 examples/digits_plain.py"
CHECKPOINT_STOP = ("accel launch --cpu -n 2 examples/checkpointing.py --project_dir runs/ckpt "
                   "--stop_after 13")
CHECKPOINT_RESUME = "accel launch --cpu -n 2 examples/checkpointing.py --project_dir runs/ckpt"
GRADIENT_ACCUMULATION = ("accel launch --cpu -n 2 examples/gradient_accumulation.py "
                         "--accumulation_steps 4")
MIXED_PRECISION = "accel launch --cpu -n 2 examples/mixed_precision.py"
INFERENCE = "accel launch --cpu -n 2 examples/inference.py --weights digits_cnn.safetensors"
TRANSFORMERS = "accel launch --cpu -n 2 examples/transformers_tiny.py"
FSDP_LM = ("accel launch --cpu -n 2 --use_fsdp --fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP "
           "--fsdp_transformer_layer_cls_to_wrap Block examples/fsdp_lm.py")
#: README's merge command: the checkpoint the second run of FSDP_LM writes
MERGE = "accel merge-weights runs/fsdp_lm/checkpoints/checkpoint_1 merged/"

#: every command this file runs verbatim (test_readme.py checks README's against these)
COMMANDS = (DIGITS, DIGITS_PLAIN_TORCHRUN, CHECKPOINT_STOP, CHECKPOINT_RESUME,
            GRADIENT_ACCUMULATION, MIXED_PRECISION, INFERENCE, TRANSFORMERS, FSDP_LM)

pytestmark = pytest.mark.slow



def argv(command: str) -> list[str]:
    """``command`` as argv, with ``accel``/``python``/``torchrun`` run by this interpreter."""
    words = shlex.split(command)
    prefix = {"accel": [sys.executable, "-m", "accel"], "python": [sys.executable],
              "torchrun": [sys.executable, "-m", "torch.distributed.run"]}
    assert words[0] in prefix, f"unexpected program in {command!r}"
    return prefix[words[0]] + words[1:]


#: What a worker prints when PyTorch's own exit race kills it: a gloo worker thread drops its
#: last reference to a finished collective's tensors after the interpreter began finalising, and
#: the C++ runtime aborts the process (SIGABRT). Plain ``torch.distributed`` scripts hit it (here
#: about one run in five of ``digits_plain.py`` on two busy cores); accel lets the group's threads
#: finish before the interpreter finalises (``accel.distributed.settle``; see test_exit.py).
UPSTREAM_EXIT_ABORT = "terminate called without an active exception"


def run(command: str, cwd: Path, upstream_exit_abort: bool = False) -> tuple[str, str]:
    """Run ``command`` in ``cwd``; fail with its output unless it exits 0.

    ``upstream_exit_abort`` accepts one failure only, for plain-PyTorch baselines: a worker
    killed by :data:`UPSTREAM_EXIT_ABORT` after the script finished. Anything else still fails.
    """
    try:
        proc = subprocess.run(argv(command), cwd=cwd, env=clean_env(cwd), capture_output=True,
                              text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{command!r} did not finish in {TIMEOUT} s:\n{exc.stdout}\n{exc.stderr}")
    known = (upstream_exit_abort and UPSTREAM_EXIT_ABORT in proc.stderr
             and "(SIGABRT)" in proc.stderr and "Traceback (most recent call last)" not in
             proc.stderr.split(UPSTREAM_EXIT_ABORT)[0])
    assert proc.returncode == 0 or known, f"{command!r} exited {proc.returncode}:\n" \
        f"{proc.stdout}\n{proc.stderr}"
    return proc.stdout, proc.stderr


def lines(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


def accuracy(out: str, count: int) -> float:
    """The one accuracy line of ``out`` (printed by the main process only), checked."""
    found = lines(out, "accuracy ")
    assert len(found) == 1, out
    match = re.fullmatch(rf"accuracy (\d\.\d{{4}}) on {count} (test images|sequences).*",
                         found[0])
    assert match, found[0]
    return float(match.group(1))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of examples/ in a fresh directory, as if the repository were checked out there."""
    root = tmp_path_factory.mktemp("examples")
    shutil.copytree(EXAMPLES, root / "examples",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints"))
    return root


@pytest.fixture(scope="module")
def digits(workdir: Path) -> tuple[str, str]:
    return run(DIGITS, workdir)


def test_digits_trains_evaluates_exactly_and_saves_safetensors(digits: tuple[str, str]) -> None:
    out, _err = digits
    for epoch in range(5):  # printed once, by the main process
        assert len(lines(out, f"epoch {epoch}: loss ")) == 1, out
    assert accuracy(out, 297) > 0.9  # 297 test images, each counted once over 2 processes
    assert lines(out, "saved ") == ["saved digits_cnn.safetensors"]


def test_digits_model_file_loads_with_accel_and_safetensors(digits: tuple[str, str],
                                                            workdir: Path) -> None:
    from safetensors import safe_open

    from accel.checkpoint import load

    path = workdir / "digits_cnn.safetensors"
    state = load(path)
    with safe_open(str(path), framework="pt") as handle:  # plain safetensors, no accel
        assert sorted(handle.keys()) == sorted(state)
    model = _example_module("digits").build_model()
    model.load_state_dict(state, strict=True)
    assert all(t.dtype == torch.float32 for t in state.values())


def _example_module(name: str) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_digits_plain_differs_from_digits_only_where_accel_is_used() -> None:
    """The shared parts of the pair are identical, so their diff shows only what accel changes."""
    import ast

    plain, accel = (ast.parse((EXAMPLES / f"{n}.py").read_text()) for n in ("digits_plain",
                                                                            "digits"))

    def functions(tree: ast.Module) -> dict[str, str]:
        return {node.name: ast.unparse(node) for node in tree.body
                if isinstance(node, ast.FunctionDef)}

    ours, theirs = functions(accel), functions(plain)
    assert set(ours) == set(theirs) == {"digits_datasets", "build_model", "parse_args", "main"}
    for name in ("digits_datasets", "build_model"):
        assert ours[name] == theirs[name], name
    assert ours["parse_args"].replace("digits_cnn.safetensors", "digits_cnn.pt") == \
        theirs["parse_args"]


def test_digits_plain_under_torchrun_counts_a_padded_sample(workdir: Path) -> None:
    # plain torch.distributed can abort at exit after finishing (see UPSTREAM_EXIT_ABORT); the
    # script's work must still be complete, which the assertions below check
    out, _err = run(DIGITS_PLAIN_TORCHRUN, workdir, upstream_exit_abort=True)
    assert len(lines(out, "epoch 4: loss ")) == 1, out
    # plain DDP evaluation: DistributedSampler repeats one image to even out the shards
    assert accuracy(out, 298) > 0.85
    state = torch.load(workdir / "digits_cnn.pt", weights_only=True)
    assert sorted(state) == sorted(_example_module("digits").build_model().state_dict())


def test_checkpointing_stops_then_resumes_exactly(workdir: Path) -> None:
    out, _err = run(CHECKPOINT_STOP, workdir)
    assert lines(out, "no checkpoint yet") == ["no checkpoint yet: starting from scratch"]
    assert lines(out, "stopped ") == ["stopped after step 13 (simulated interruption)"]
    first = {int(m.group(1)): m.group(0) for m in re.finditer(r"^step (\d+): loss .*$", out,
                                                               re.MULTILINE)}
    assert sorted(first) == list(range(1, 14))
    root = workdir / "runs" / "ckpt" / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint_2", "checkpoint_3"]  # limit 2
    assert all((root / name / "manifest.json").is_file() for name in ("checkpoint_2",
                                                                      "checkpoint_3"))

    out, _err = run(CHECKPOINT_RESUME, workdir)
    assert lines(out, "resumed ") == \
        ["resumed from runs/ckpt/checkpoints/checkpoint_3 at step 12"], out
    second = {int(m.group(1)): m.group(0) for m in re.finditer(r"^step (\d+): loss .*$", out,
                                                                re.MULTILINE)}
    assert sorted(second) == list(range(13, 31))
    assert second[13] == first[13]  # the next unseen batch, same weights, same RNG: same loss
    assert lines(out, "finished") == ["finished: 30 steps"]
    # at most total_limit=2: the newest, and the checkpoint this run resumed from
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint_3", "checkpoint_9"]


def test_gradient_accumulation_updates_once_per_four_micro_batches(workdir: Path) -> None:
    out, _err = run(GRADIENT_ACCUMULATION, workdir)
    assert lines(out, "2 processes x micro-batch 8 x 4 accumulation steps = 64 images")
    counts = lines(out, "")[-2]  # "<micro> micro-batches, <updates> optimizer updates ..."
    match = re.fullmatch(r"(\d+) micro-batches, (\d+) optimizer updates per process", counts)
    assert match, out
    per_epoch = -(-1500 // (2 * 8))  # 1500 training images, 2 processes, micro-batches of 8
    assert int(match.group(1)) == 3 * per_epoch
    assert int(match.group(2)) == 3 * -(-per_epoch // 4)  # the loader's end also updates
    assert accuracy(out, 297) > 0.85


def test_mixed_precision_bf16_on_cpu(workdir: Path) -> None:
    out, _err = run(MIXED_PRECISION, workdir)
    assert lines(out, "mixed_precision=") == [
        "mixed_precision=bf16: convolution output torch.bfloat16, model output torch.float32, "
        "parameters torch.float32"]
    assert accuracy(out, 297) > 0.85


def test_inference_splits_and_gathers_every_image_once(digits: tuple[str, str],
                                                       workdir: Path) -> None:
    out, err = run(INFERENCE, workdir)
    assert "[rank 0] 149 images, ids 0..148" in err and "[rank 1] 148 images, ids 149..296" in err
    found = lines(out, "297 predictions from 2 processes, accuracy ")
    assert len(found) == 1, out
    # the same model on the same images: the same accuracy as digits.py's evaluation
    assert found[0].endswith(f"accuracy {accuracy(digits[0], 297):.4f}")


def test_notebook_runs_in_a_jupyter_kernel(workdir: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(workdir / "examples" / "notebook.ipynb", as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=TIMEOUT, kernel_name="python3",
                                     resources={"metadata": {"path": str(workdir)}})
    client.execute()  # raises CellExecutionError, with the cell's traceback, if a cell fails
    text = "".join(out.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                   for out in cell.outputs if out["output_type"] == "stream")
    printed = accuracy(text, 297)
    assert printed > 0.85
    assert f"notebook_launcher returned rank 0's accuracy: {printed:.4f}" in text


def test_transformers_tiny_gathers_dicts_and_saves_a_loadable_model(workdir: Path) -> None:
    transformers = pytest.importorskip(
        "transformers", reason="the optional extra is not installed: pip install -e "
        "'.[transformers]' (without it the example cannot run)")
    out, _err = run(TRANSFORMERS, workdir)
    assert len(lines(out, "epoch 2: loss ")) == 1, out
    accuracy(out, 201)  # 201 sequences, each once, gathered as a dict of tensors
    from accel.checkpoint import load_model_state

    saved = load_model_state(workdir / "tiny_bert")
    model = transformers.BertForSequenceClassification.from_pretrained(workdir / "tiny_bert")
    state = model.state_dict()
    assert saved and all(torch.equal(state[name], tensor) for name, tensor in saved.items())


def test_fsdp_lm_trains_sharded_saves_shards_and_resumes(workdir: Path) -> None:
    out, _err = run(FSDP_LM + " --steps 30", workdir)
    assert lines(out, "FSDP: ") == ["FSDP: 2 processes, mesh (2,)"], out
    losses = [float(line.split()[-1]) for line in lines(out, "step ")]
    assert len(losses) == 3 and losses[-1] < 4.0, out  # ln(256) = 5.5 for a uniform guess
    found = lines(out, "saved checkpoint ")
    assert len(found) == 1, out
    checkpoint = workdir / found[0].split()[-1]
    names = {p.relative_to(checkpoint).as_posix() for p in checkpoint.rglob("*") if p.is_file()}
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    assert names - {"manifest.json"} == set(manifest["files"]), names  # every file checked
    assert not any(n.endswith((".metadata", ".pt", ".bin", ".pkl")) for n in names), names
    assert any(n.endswith(".safetensors") and "model" in n for n in names), names
    # the consolidated weights load into the plain model, without accel or a process group
    from safetensors.torch import load_file

    model = _example_module("fsdp_lm").CharLM()
    state = load_file(str(workdir / "fsdp_lm_model" / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"head.weight"}, (missing, unexpected)  # tied

    out, _err = run(FSDP_LM + " --steps 40", workdir)
    assert lines(out, "resumed from ") == [f"resumed from {found[0].split()[-1]} at step 30"], out
    assert [line.split()[1] for line in lines(out, "step ")] == ["40:"], out
    assert lines(out, "saved checkpoint ") == ["saved checkpoint runs/fsdp_lm/checkpoints/"
                                               "checkpoint_1"], out
    # merging the step-40 checkpoint gives the weights save_model wrote at step 40
    run(MERGE, workdir)
    merged = load_file(str(workdir / "merged" / "model.safetensors"))
    saved = load_file(str(workdir / "fsdp_lm_model" / "model.safetensors"))
    assert set(saved) <= set(merged) and all(torch.equal(merged[k], saved[k]) for k in saved)
