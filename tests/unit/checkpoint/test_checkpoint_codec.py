"""Round trips of real training state through the pickle-free codec (and through JSON text)."""

from __future__ import annotations

import json
import math
import random
from collections import OrderedDict, namedtuple
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from accel.checkpoint import CheckpointWriter, decode, encode, read_state


def _roundtrip(state: Any) -> Any:
    """Encode, go through strict JSON text and fresh tensor memory (as on disk), decode."""
    tensors, structure = encode(state)
    text = json.dumps(structure, allow_nan=False)
    return decode(json.loads(text), {k: v.clone() for k, v in tensors.items()})


def _same(a: Any, b: Any) -> None:
    """Exact equality including container types, dict key types and tensor dtypes."""
    assert type(a) is type(b), (type(a), type(b), a, b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            _same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b)
    else:
        assert a == b


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        loss = model(torch.randn(8, 6, generator=gen)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()


def test_adam_state_round_trip_resumes_bit_identically() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, amsgrad=True)
    _train(model, opt, 3, seed=1)
    saved_opt = _roundtrip(opt.state_dict())
    _same(opt.state_dict(), saved_opt)
    assert all(type(k) is int for k in saved_opt["state"])  # not "0", "1" as plain JSON would
    assert isinstance(saved_opt["param_groups"][0]["betas"], tuple)
    saved_model = _roundtrip(model.state_dict())

    clone = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 1))
    clone_opt = torch.optim.Adam(clone.parameters(), lr=1e-2, amsgrad=True)
    clone.load_state_dict(saved_model)
    clone_opt.load_state_dict(saved_opt)
    _train(model, opt, 2, seed=2)
    _train(clone, clone_opt, 2, seed=2)
    for p, q in zip(model.parameters(), clone.parameters()):
        assert torch.equal(p, q)


def test_schedulers_and_grad_scaler_round_trip() -> None:
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)  # holds best=inf, mode_worse=inf
    plateau.step(float("nan"))
    onecycle = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=10)
    for _ in range(3):
        opt.step()
        onecycle.step()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    for state in (plateau.state_dict(), onecycle.state_dict(), scaler.state_dict()):
        _same(state, _roundtrip(state))
    assert _roundtrip(plateau.state_dict())["best"] == math.inf
    restored = torch.amp.GradScaler("cpu")
    restored.load_state_dict(_roundtrip(scaler.state_dict()))
    assert restored.get_scale() == 1024.0


def test_rng_states_round_trip_reproduce_the_same_numbers(tmp_path: Path) -> None:
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    writer = CheckpointWriter(tmp_path / "ckpt")
    writer.write_state("rng/rank_0", state)
    ckpt = writer.finalize(step=0, world_size=1)
    expected = ([random.random() for _ in range(5)], np.random.rand(5).tolist(),
                torch.rand(5).tolist())
    loaded = read_state(ckpt, "rng/rank_0")
    _same(state, loaded)
    random.setstate(loaded["python"])
    np.random.set_state(loaded["numpy"])
    torch.set_rng_state(loaded["torch"])
    assert ([random.random() for _ in range(5)], np.random.rand(5).tolist(),
            torch.rand(5).tolist()) == expected
    # the numpy state tensor file is readable by safetensors tooling
    from safetensors.torch import load_file
    assert set(load_file(str(ckpt / "rng/rank_0.safetensors"))) == {"numpy.1", "torch"}


def test_nested_structure_keeps_every_type() -> None:
    Point = namedtuple("Point", "x y")
    shared = torch.arange(6.0)
    state = {
        "floats": [math.inf, -math.inf, math.nan, -0.0, 1e308, 0.1],
        "tuple": (1, (2, [3, (4,)]), ()),
        0: "int key", 1.5: "float key", (1, 2): "tuple key", None: "none key", True: "bool key",
        "$tensor": "a key that looks like a tag",
        "ordered": OrderedDict(b=1, a=2),
        "misc": [None, True, False, "s", 2**70, b"\x00\xff", 1 + 2j, {3, 4}, frozenset({5})],
        "torch": [torch.float16, torch.device("cpu"), torch.Size([2, 3])],
        "numpy": [np.arange(6, dtype=">i4").reshape(2, 3), np.float32(1.5), np.int64(-3),
                  np.zeros((0, 2), dtype=np.float64), np.array([1, 2], dtype=np.uint64)],
        "tensors": [torch.tensor([1, 2], dtype=torch.bfloat16), torch.tensor(True),
                    torch.zeros(0, 3), torch.arange(12).reshape(3, 4).t(), shared, shared,
                    shared[2:4]],
        "point": Point(1, 2),
    }
    out = _roundtrip(state)
    assert list(out) == list(state)
    assert out["point"] == (1, 2) and type(out["point"]) is tuple  # documented: plain tuple
    state["point"] = (1, 2)
    state["ordered"] = dict(state["ordered"])
    _same(state, out)
    assert out["numpy"][0].dtype == np.dtype(">i4")
    assert type(out["numpy"][1]) is np.float32 and out["numpy"][1] == np.float32(1.5)
    assert out["tensors"][4] is out["tensors"][5]  # one tensor object stays one
    assert out["tensors"][6].tolist() == [2.0, 3.0]


def test_encoded_structure_is_strict_json_and_names_tensors_by_path() -> None:
    tensors, structure = encode({"state": {0: {"exp_avg": torch.ones(2)}}, "x": math.nan})
    json.dumps(structure, allow_nan=False)  # raises if a NaN slipped through
    assert list(tensors) == ["state.0.exp_avg"]


@pytest.mark.parametrize("bad", [object(), Path("x"), np.array([object()]), lambda: 1])
def test_unknown_leaf_raises_type_error_naming_the_path(bad: Any) -> None:
    with pytest.raises(TypeError) as info:
        encode({"opt": {"state": {3: {"thing": bad}}}})
    message = str(info.value)
    assert "state['opt']['state'][3]['thing']" in message
    assert "pickle" in message and "state_dict()" in message


def test_decode_rejects_malformed_structures() -> None:
    with pytest.raises(ValueError, match="lacks"):
        decode({"$tensor": "missing"}, {})
    with pytest.raises(ValueError, match="float"):
        decode({"$float": "1e999"}, {})
    with pytest.raises(ValueError, match="dtype"):
        decode({"$dtype": "Tensor"}, {})
