"""torch.compile in accel: ``TorchDynamoPlugin`` (Accelerate's fields, defaults and
``ACCEL_DYNAMO_*`` fallbacks), what ``prepare()`` compiles, ``unwrap_model(keep_torch_compile)``,
clean parameter names in checkpoints, and errors that say how to fix them.

Most tests compile with the ``eager`` backend (dynamo tracing only: milliseconds). One
module-scoped Accelerator compiles a small MLP with inductor through the ``accel launch`` path
(``ACCEL_DYNAMO_BACKEND=inductor``) and several tests reuse it: training against eager,
checkpoints, unwrapping, and a measurement of compile and step times (printed, never asserted).
"""

from __future__ import annotations

import copy
import os
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from torch import nn

from accel import Accelerator, AcceleratorState, TorchDynamoPlugin
from accel import utils as accel_utils
from accel.env import DYNAMO_BACKENDS, EnvSettings, read_settings, settings_environment
from accel.strategy.compile import (
    DynamoBackend,
    compile_regions,
    has_compiled_regions,
    rewrap_compiled,
)
from accel.utils import extract_model_from_parallel, is_compiled_module

DYNAMO_VARIABLES = ("ACCEL_DYNAMO_BACKEND", "ACCEL_DYNAMO_MODE", "ACCEL_DYNAMO_USE_FULLGRAPH",
                    "ACCEL_DYNAMO_USE_DYNAMIC", "ACCEL_DYNAMO_USE_REGIONAL_COMPILATION")


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in DYNAMO_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    torch._dynamo.reset()  # no cached graph of one test serves another
    torch._dynamo.utils.counters.clear()
    yield


WIDTH = 64


class MLP(nn.Module):
    """Three repeated blocks and a head: regional compilation has a list to compile."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(WIDTH, WIDTH) for _ in range(3)])
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.relu(block(x))
        return self.head(x)


def _mlp(seed: int = 0) -> MLP:
    torch.manual_seed(seed)
    return MLP()


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(32, WIDTH, generator=g), torch.randn(32, 1, generator=g))
            for _ in range(n)]


def _keys(path: Path) -> list[str]:
    with safe_open(str(path), "pt") as handle:
        return sorted(handle.keys())


CLEAN_KEYS = sorted(_mlp().state_dict())


# ------------------------------------------------------------------ the plugin
def test_plugin_defaults_are_accelerates() -> None:
    plugin = TorchDynamoPlugin()
    assert (plugin.backend, plugin.mode, plugin.fullgraph, plugin.dynamic, plugin.options,
            plugin.disable, plugin.use_regional_compilation) == (
        DynamoBackend.NO, "default", False, None, None, False, False)
    assert not plugin.compiles and plugin.to_kwargs() == {}
    assert [b.value.lower() for b in DynamoBackend] == list(DYNAMO_BACKENDS)
    full = TorchDynamoPlugin(backend=DynamoBackend.INDUCTOR, mode="reduce-overhead",
                             fullgraph=True, dynamic=False, use_regional_compilation=True)
    assert full.to_kwargs() == {"backend": "inductor", "mode": "reduce-overhead",
                                "fullgraph": True, "dynamic": False}
    assert full.to_dict()["backend"] == "inductor" and full.to_dict()["use_regional_compilation"]
    assert TorchDynamoPlugin(backend="Aot_Eager").backend is DynamoBackend.AOT_EAGER
    assert TorchDynamoPlugin(backend="inductor", options={"max_autotune": True}).to_kwargs() == {
        "backend": "inductor", "options": {"max_autotune": True}}


def test_plugin_fields_left_unset_come_from_accel_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in (("BACKEND", "INDUCTOR"), ("MODE", "max-autotune"), ("USE_FULLGRAPH", "1"),
                        ("USE_DYNAMIC", "0"), ("USE_REGIONAL_COMPILATION", "true")):
        monkeypatch.setenv(f"ACCEL_DYNAMO_{name}", value)
    plugin = TorchDynamoPlugin()
    assert (plugin.backend, plugin.mode, plugin.fullgraph, plugin.dynamic,
            plugin.use_regional_compilation) == (DynamoBackend.INDUCTOR, "max-autotune", True,
                                                 False, True)
    given = TorchDynamoPlugin(mode="default", fullgraph=False, dynamic=True,
                              use_regional_compilation=False)  # arguments beat the variables
    assert (given.backend, given.mode, given.fullgraph, given.dynamic,
            given.use_regional_compilation) == (DynamoBackend.INDUCTOR, "default", False, True,
                                                False)


def test_launch_dynamo_settings_round_trip_through_the_worker_environment() -> None:
    # accel launch writes the user's choices (flag, env or YAML dynamo_config) as ACCEL_DYNAMO_*;
    # an explicit dynamic=False must survive (it differs from torch's default None).
    env = settings_environment(EnvSettings(dynamo_backend="inductor", dynamo_use_dynamic=False))
    assert env == {"ACCEL_DYNAMO_BACKEND": "inductor", "ACCEL_DYNAMO_USE_DYNAMIC": "0"}
    back = read_settings(env)
    assert (back.dynamo_backend, back.dynamo_use_dynamic) == ("inductor", False)
    assert read_settings({}).dynamo_use_dynamic is None
    assert "ACCEL_DYNAMO_USE_DYNAMIC" not in settings_environment(EnvSettings())


def test_yaml_dynamo_config_reaches_the_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    from accel.launch.config_file import parse_config
    from accel.launch.torchrun import worker_env
    from tests.unit.launch.test_cli import settings

    config = parse_config({"distributed_type": "MULTI_CPU", "dynamo_config": {
        "dynamo_backend": "INDUCTOR", "dynamo_mode": "max-autotune",
        "dynamo_use_dynamic": False, "dynamo_use_regional_compilation": True}}, "c.yaml")
    env = worker_env(settings(["t.py"], config=config))  # what accel launch exports
    for name in DYNAMO_VARIABLES:
        if name in env:
            monkeypatch.setenv(name, env[name])
    plugin = TorchDynamoPlugin()  # in the worker
    assert (plugin.backend, plugin.mode, plugin.dynamic, plugin.use_regional_compilation) == (
        DynamoBackend.INDUCTOR, "max-autotune", False, True)


def test_plugin_errors_say_what_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"TorchDynamoPlugin\(backend=...\)='fast' is not a dynamo "
                       r"backend; expected one of no, eager, aot_eager, inductor, .*; pass "
                       "backend='inductor'"):
        TorchDynamoPlugin(backend="fast")
    with pytest.raises(ValueError, match=r"'turbo' is not a torch.compile mode; expected one of "
                       "default, reduce-overhead, max-autotune"):
        TorchDynamoPlugin(backend="inductor", mode="turbo")
    with pytest.raises(ValueError, match=r"mode='max-autotune' .* needs a compiling backend, but "
                       r"the 'eager' backend takes none .*use backend='inductor'"):
        TorchDynamoPlugin(backend="eager", mode="max-autotune")
    with pytest.raises(ValueError, match=r"options=\.\.\. needs a compiling backend.*'aot_eager'"):
        TorchDynamoPlugin(backend="aot_eager", options={"a": 1})
    with pytest.raises(ValueError, match="mode='max-autotune' .* and options=... cannot be used "
                       "together"):
        TorchDynamoPlugin(backend="inductor", mode="max-autotune", options={"a": 1})
    with pytest.raises(TypeError, match=r"fullgraph=...\) must be True or False, got 'yes'"):
        TorchDynamoPlugin(fullgraph="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="options=...\\) must be a dict"):
        TorchDynamoPlugin(backend="inductor", options=["max_autotune"])
    monkeypatch.setenv("ACCEL_DYNAMO_MODE", "reduce-overhead")  # the source is named
    with pytest.raises(ValueError, match=r"mode='reduce-overhead' \(ACCEL_DYNAMO_MODE\) needs"):
        TorchDynamoPlugin(backend="cudagraphs")


def test_backend_torch_does_not_have_fails_at_prepare_naming_those_it_has() -> None:
    accelerator = Accelerator(cpu=True, dynamo_backend="ofi")  # an Accelerate name, gone from torch
    with pytest.raises(ValueError, match=r"dynamo backend 'ofi' is not registered with torch .*"
                       r"\(registered: .*inductor.*\); install and import the package"):
        accelerator.prepare(nn.Linear(2, 1))


# ------------------------------------------------------------------ Accelerator arguments
def test_accelerator_dynamo_arguments_and_state(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="pass either dynamo_backend or dynamo_plugin, not both"):
        Accelerator(cpu=True, dynamo_backend="eager", dynamo_plugin=TorchDynamoPlugin())
    with pytest.raises(TypeError, match="dynamo_plugin must be a TorchDynamoPlugin, got dict"):
        Accelerator(cpu=True, dynamo_plugin={"backend": "eager"})  # type: ignore[arg-type]
    assert Accelerator(cpu=True).state.dynamo_plugin.backend is DynamoBackend.NO
    assert Accelerator(cpu=True, dynamo_backend="INDUCTOR").state.dynamo_plugin.backend is \
        DynamoBackend.INDUCTOR
    plugin = TorchDynamoPlugin(backend="inductor", mode="max-autotune")
    assert Accelerator(cpu=True, dynamo_plugin=plugin).state.dynamo_plugin is plugin
    assert AcceleratorState(cpu=True, dynamo_plugin=plugin).dynamo_plugin is plugin
    assert AcceleratorState(cpu=True).dynamo_plugin is None
    monkeypatch.setenv("ACCEL_DYNAMO_BACKEND", "inductor")
    with pytest.warns(UserWarning, match=r"Accelerator\(dynamo_backend='eager'\) overrides "
                      "ACCEL_DYNAMO_BACKEND='inductor'"):
        accelerator = Accelerator(cpu=True, dynamo_backend="eager")
    assert accelerator.state.dynamo_plugin.backend is DynamoBackend.EAGER
    monkeypatch.setenv("ACCEL_DYNAMO_BACKEND", "no")
    monkeypatch.setenv("ACCEL_DYNAMO_MODE", "max-autotune")
    with pytest.warns(UserWarning, match="settings mode are ignored: the dynamo backend is 'no'"):
        Accelerator(cpu=True)
    monkeypatch.delenv("ACCEL_DYNAMO_MODE")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Accelerator(cpu=True)  # backend "no" alone: nothing to say


def test_backend_no_and_disable_and_evaluation_mode() -> None:
    net = _mlp()
    assert Accelerator(cpu=True, dynamo_backend="no").prepare(net) is net
    evaluated = Accelerator(cpu=True, dynamo_backend="eager").prepare_model(
        _mlp(), evaluation_mode=True)
    assert is_compiled_module(evaluated)  # compiled for inference too, as in Accelerate
    plugin = TorchDynamoPlugin(backend="inductor", disable=True)
    model = Accelerator(cpu=True, dynamo_plugin=plugin).prepare(_mlp())
    x = torch.randn(2, WIDTH)
    torch._dynamo.utils.counters.clear()
    assert torch.equal(model(x), net(x))
    assert not torch._dynamo.utils.counters["stats"]["unique_graphs"]  # ran eagerly


# ------------------------------------------------------------------ what prepare() compiles
def test_prepare_compiles_with_the_plugin_and_training_matches_eager(tmp_path: Path) -> None:
    net, twin = _mlp(), _mlp()
    accelerator = Accelerator(cpu=True, dynamo_backend="eager", project_dir=str(tmp_path))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    model, opt = accelerator.prepare(net, opt)
    assert is_compiled_module(model) and model._orig_mod is net
    assert accelerator._run.models == [model]
    twin_opt = torch.optim.SGD(twin.parameters(), lr=0.1)
    for x, y in _batches(3):
        loss = nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        expected = nn.functional.mse_loss(twin(x), y)
        expected.backward()
        twin_opt.step()
        twin_opt.zero_grad()
        assert torch.allclose(loss, expected, atol=1e-6)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # dynamo captured it


def test_model_the_user_compiled_is_not_compiled_again_and_saves_clean(tmp_path: Path) -> None:
    net = _mlp()
    compiled = torch.compile(net, backend="eager")
    accelerator = Accelerator(cpu=True, dynamo_backend="eager", project_dir=str(tmp_path))
    with pytest.warns(UserWarning, match="MLP is compiled already .* not compiled again with "
                      "dynamo backend 'eager'"):
        model = accelerator.prepare(compiled)
    assert model is compiled  # not torch.compile(torch.compile(net))
    x = torch.randn(4, WIDTH)
    before = model(x).detach()
    folder = Path(accelerator.save_state())
    assert _keys(folder / "model_0.safetensors") == CLEAN_KEYS
    accelerator.save_model(model, str(tmp_path / "exported"))
    assert _keys(tmp_path / "exported" / "model.safetensors") == CLEAN_KEYS
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
    accelerator.load_state(str(folder))
    assert torch.equal(model(x).detach(), before)
    assert accelerator.unwrap_model(model) is compiled
    assert accelerator.unwrap_model(model, keep_torch_compile=False) is net


def test_regional_compilation_compiles_each_repeated_block(tmp_path: Path) -> None:
    net = _mlp()
    plugin = TorchDynamoPlugin(backend="eager", use_regional_compilation=True)
    accelerator = Accelerator(cpu=True, dynamo_plugin=plugin, project_dir=str(tmp_path))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    model, opt = accelerator.prepare(net, opt)
    assert type(model) is MLP and model is not net and model._orig_mod is net
    assert all(is_compiled_module(block) for block in model.blocks)
    assert not is_compiled_module(model.head) and model.head is net.head
    assert not has_compiled_regions(net)  # the user's module is left as it was
    assert list(model.parameters()) == list(net.parameters())  # the same tensors
    x, y = _batches(1)[0]
    expected = net(x)
    assert torch.allclose(model(x), expected)
    accelerator.backward(nn.functional.mse_loss(model(x), y))
    opt.step()
    assert not torch.allclose(net(x), expected)  # training the result trains the user's module
    assert sorted(accelerator.get_state_dict(model)) == CLEAN_KEYS
    assert _keys(Path(accelerator.save_state()) / "model_0.safetensors") == CLEAN_KEYS
    assert accelerator.unwrap_model(model) is model
    assert accelerator.unwrap_model(model, keep_torch_compile=False) is net
    # No repeated blocks: the whole module is compiled.
    whole = compile_regions(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), backend="eager")
    assert is_compiled_module(whole)
    with pytest.warns(UserWarning, match="compiled already"):
        assert Accelerator(cpu=True, dynamo_plugin=plugin).prepare(model) is model


def test_unwrap_keeps_or_drops_the_compile_wrapper() -> None:
    net = _mlp()
    accelerator = Accelerator(cpu=True, mixed_precision="bf16", dynamo_backend="eager")
    model = accelerator.prepare(net)
    assert accelerator.unwrap_model(model) is model  # keep_torch_compile=True, as Accelerate
    assert extract_model_from_parallel(model) is model
    assert extract_model_from_parallel(model, keep_torch_compile=False) is net
    assert "forward" in vars(net)  # the autocast wrapper, on the module compile wraps
    x = torch.randn(2, WIDTH)
    assert model(x).dtype == torch.float32 and torch._dynamo.utils.counters["stats"][
        "unique_graphs"] >= 1  # autocast traced inside the graph; fp32 out
    assert accelerator.unwrap_model(model, keep_fp32_wrapper=False,
                                    keep_torch_compile=False) is net
    assert "forward" not in vars(net)
    # torch.compile(wrapper(module)), as prepare() makes with DDP: a new wrapper around the
    # module with the same settings; the trained one still holds the wrapper.
    holder = nn.Sequential(net)
    compiled = torch.compile(holder, backend="eager")
    kept = rewrap_compiled(compiled, net)
    assert kept is not None and is_compiled_module(kept) and kept._orig_mod is net
    assert kept.dynamo_ctx is compiled.dynamo_ctx and compiled._orig_mod is holder
    assert rewrap_compiled(compiled, holder) is compiled
    assert rewrap_compiled(net, net) is None
    assert accel_utils.TorchDynamoPlugin is TorchDynamoPlugin


def test_no_sync_reaches_the_ddp_inside_a_compiled_model() -> None:
    # (DDP itself needs processes: tests/distributed/test_compile.py.) A strategy sees through
    # the compile wrapper: accumulate() and the checkpoint path use this.
    from accel.strategy.base import strip_compile, unwrap_module

    holder = nn.Sequential(_mlp())
    compiled = torch.compile(holder, backend="eager")
    assert strip_compile(compiled) is holder and strip_compile(holder) is holder
    assert unwrap_module(compiled) is holder


# ------------------------------------------------------------------ inductor, for real
@pytest.fixture(scope="module")
def inductor_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One inductor compile of the MLP, reached the way ``accel launch --dynamo_backend
    inductor`` reaches a worker (the variable), trained 6 steps beside an eager twin."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with pytest.MonkeyPatch.context() as mp:
        for name in DYNAMO_VARIABLES:
            mp.delenv(name, raising=False)
        mp.setenv("ACCEL_DYNAMO_BACKEND", "inductor")
        accelerator = Accelerator(cpu=True, project_dir=str(tmp_path_factory.mktemp("inductor")))
    net = _mlp()
    twin = copy.deepcopy(net)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    model, opt = accelerator.prepare(net, opt)
    twin_opt = torch.optim.AdamW(twin.parameters(), lr=1e-2)
    losses: list[tuple[float, float]] = []
    times: dict[str, list[float]] = {"compiled": [], "eager": []}
    for x, y in _batches(6):
        start = time.perf_counter()
        loss = nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        times["compiled"].append(time.perf_counter() - start)
        start = time.perf_counter()
        expected = nn.functional.mse_loss(twin(x), y)
        expected.backward()
        twin_opt.step()
        twin_opt.zero_grad()
        times["eager"].append(time.perf_counter() - start)
        losses.append((loss.item(), expected.item()))
    yield {"accelerator": accelerator, "model": model, "net": net, "twin": twin, "opt": opt,
           "losses": losses, "times": times, "counters": copy.deepcopy(
               {k: dict(v) for k, v in torch._dynamo.utils.counters.items()})}
    torch._dynamo.reset()


def test_inductor_from_the_launch_variable_compiles_and_trains_like_eager(
        inductor_run: dict[str, Any]) -> None:
    model, accelerator = inductor_run["model"], inductor_run["accelerator"]
    assert accelerator.state.dynamo_plugin.backend is DynamoBackend.INDUCTOR
    assert is_compiled_module(model) and model._orig_mod is inductor_run["net"]
    counters = inductor_run["counters"]
    assert counters["stats"]["unique_graphs"] >= 1 and counters["aot_autograd"]["ok"] >= 1
    assert counters["inductor"], "inductor generated no code"
    for compiled, eager in inductor_run["losses"]:
        assert compiled == pytest.approx(eager, rel=1e-4, abs=1e-6)
    for p, q in zip(inductor_run["net"].parameters(), inductor_run["twin"].parameters(),
                    strict=True):
        assert torch.allclose(p, q, atol=1e-5)


def test_inductor_model_checkpoints_with_clean_names_and_loads_back(
        inductor_run: dict[str, Any], tmp_path: Path) -> None:
    accelerator, model = inductor_run["accelerator"], inductor_run["model"]
    net = inductor_run["net"]
    folder = Path(accelerator.save_state(str(tmp_path / "ckpt")))
    assert _keys(folder / "model_0.safetensors") == CLEAN_KEYS
    accelerator.save_model(model, str(tmp_path / "exported"))
    assert _keys(tmp_path / "exported" / "model.safetensors") == CLEAN_KEYS
    assert sorted(accelerator.get_state_dict(model)) == CLEAN_KEYS
    saved = {name: t.clone() for name, t in net.state_dict().items()}
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(0.5).add_(1.0)
    accelerator.load_state(str(folder))
    for name, t in net.state_dict().items():
        assert torch.equal(t, saved[name]), name
    unwrapped = accelerator.unwrap_model(model)
    assert unwrapped is model and accelerator.unwrap_model(model, keep_torch_compile=False) is net
    assert sorted(unwrapped.state_dict()) == ["_orig_mod." + k for k in CLEAN_KEYS]  # torch's


def test_measure_compile_on_cpu(inductor_run: dict[str, Any]) -> None:
    """Compile time and steady-state step time against eager, printed (run with -s)."""
    compiled, eager = inductor_run["times"]["compiled"], inductor_run["times"]["eager"]
    steady = sorted(compiled[1:])[len(compiled[1:]) // 2]
    eager_steady = sorted(eager[1:])[len(eager[1:]) // 2]
    print(f"\ninductor on CPU ({os.cpu_count()} cores, MLP of 3 {WIDTH}x{WIDTH} blocks, batch 32, "
          f"AdamW): first step "
          f"(compile) {compiled[0]:.2f} s; steady step {steady * 1e3:.2f} ms vs eager "
          f"{eager_steady * 1e3:.2f} ms ({eager_steady / steady:.2f}x)")
    assert len(compiled) == len(eager) == 6 and all(t > 0 for t in compiled + eager)
