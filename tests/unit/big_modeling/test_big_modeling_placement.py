"""Sizes, memory budgets and device maps (accel.big_modeling: sizes, budget, placement).

GPUs are simulated where the placement order matters (``budget._gpu_count`` patched): the
placement is arithmetic on sizes, and this machine has no GPU. Where Accelerate is installed,
maps and balanced budgets are compared with its own functions on the same models.
"""

from __future__ import annotations

import gc
import os
import warnings
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from torch import nn

import accel
import accel.utils
from accel.big_modeling import (
    budget,
    check_device_map,
    clean_device_map,
    compute_module_sizes,
    convert_file_size_to_int,
    find_tied_parameters,
    get_balanced_memory,
    get_max_layer_size,
    get_max_memory,
    infer_auto_device_map,
    init_empty_weights,
)

# ------------------------------------------------------------------ models


class Block(nn.Module):
    """A residual block: must not be split (its two halves share the input)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.a = nn.Linear(width, width)
        self.b = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.relu(self.a(x)))


class TinyLM(nn.Module):
    """Embedding, blocks, and an output head tied to the embedding (as GPT-2's)."""

    def __init__(self, vocab: int = 100, width: int = 10, depth: int = 4, tied: bool = True,
                 head_bias: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=head_bias)
        if tied:
            self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def _linear_bytes(width: int, dtype_bytes: int = 4) -> int:
    return (width * width + width) * dtype_bytes


def _fake_gpus(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    monkeypatch.setattr(budget, "_gpu_count", lambda: count)


def _all_tensor_names(model: nn.Module) -> list[str]:
    return [n for n, _ in [*model.named_parameters(remove_duplicate=False),
                           *model.named_buffers(remove_duplicate=False)]]


# ------------------------------------------------------------------ sizes


@pytest.mark.parametrize(("text", "expected"), [
    ("10GB", 10 * 10**9), ("10GiB", 10 * 2**30), ("500MB", 500 * 10**6), ("1.5GB", 1_500_000_000),
    ("1.5 GiB", int(1.5 * 2**30)), ("2KiB", 2048), ("3kb", 375), ("8Gb", 10**9), ("1TB", 10**12),
    ("4MiB", 4 * 2**20), ("123", 123), ("7B", 7), (0, 0), (4096, 4096), ("  20 mb ", 2_500_000),
])
def test_sizes_accept_decimal_binary_and_accelerate_spellings(text: object,
                                                               expected: int) -> None:
    assert convert_file_size_to_int(text) == expected  # type: ignore[arg-type]


def test_sizes_agree_with_accelerate_on_its_spellings() -> None:
    utils = pytest.importorskip("accelerate.utils", reason="pip install '.[test]'")
    for text in ("10GB", "10GiB", "500MB", "1.5GB", "5MiB", "3KiB", "2KB", "8Gb", "20mb", 77):
        assert convert_file_size_to_int(text) == utils.convert_file_size_to_int(text), text


@pytest.mark.parametrize("bad", ["ten GB", "-1GB", "10XB", "", "GB", "1.2.3GB", "10 G", "5iB"])
def test_nonsense_sizes_say_what_is_accepted(bad: str) -> None:
    with pytest.raises(ValueError, match=r"size") as info:
        convert_file_size_to_int(bad)
    assert "GiB" in str(info.value) or "B'" in str(info.value)


def test_non_size_types_and_negative_ints_are_errors() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        convert_file_size_to_int(-1)
    for bad in (True, 1.5, None):
        with pytest.raises(TypeError, match="500MB"):
            convert_file_size_to_int(bad)  # type: ignore[arg-type]


# ------------------------------------------------------------------ budgets


def test_max_memory_keys_are_normalized_and_ordered(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_gpus(monkeypatch, 2)
    got = get_max_memory({"disk": "1TB", "cpu": "2GiB", "cuda:1": "1GB", "0": 5,
                          })
    assert list(got.items()) == [(0, 5), (1, 10**9), ("cpu", 2 * 2**30), ("disk", 10**12)]
    assert get_max_memory({torch.device("cuda", 1): 3}) == {1: 3}


def test_a_gpu_this_machine_lacks_is_kept_and_logged(monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    _fake_gpus(monkeypatch, 1)
    with caplog.at_level("WARNING", logger="accel.big_modeling.budget"):
        got = get_max_memory({"cpu": 7, 3: "1GB", "cuda:0": 5})
    assert "GPU 3, which this machine does not have" in caplog.text
    assert list(got.items()) == [(0, 5), (3, 10**9), ("cpu", 7)]


def test_a_key_naming_no_device_lists_the_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_gpus(monkeypatch, 1)
    with pytest.raises(ValueError, match=r"'tpu' names no device .* 0, 'cpu', 'disk'"):
        get_max_memory({"tpu": "1GB"})
    with pytest.raises(ValueError, match=r"names device 0 twice"):
        get_max_memory({0: "1GB", "cuda:0": "1GB"})
    with pytest.raises(ValueError, match=r"max_memory\['cpu'\]: cannot read .* '1 potato'"):
        get_max_memory({"cpu": "1 potato"})
    _fake_gpus(monkeypatch, 0)
    with pytest.raises(ValueError, match="no GPU is visible"):
        infer_auto_device_map(nn.Linear(2, 2), {"xla": "1GB", "cpu": "1GB"})


def test_detected_budget_is_the_hosts_available_memory() -> None:
    detected = get_max_memory()
    assert list(detected) == ["cpu"]  # this machine has no GPU
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    available = int(meminfo["MemAvailable"].split()[0]) * 1024
    assert 0 < detected["cpu"] <= available * 1.2  # capped by a cgroup limit, if any


# ------------------------------------------------------------------ module sizes


def test_module_sizes_follow_dtype_special_dtypes_and_count_ties_once() -> None:
    model = TinyLM(vocab=100, width=10, depth=2)
    model.register_buffer("steps", torch.zeros(5, dtype=torch.int64))
    fp32 = compute_module_sizes(model)
    assert fp32["embed"] == 100 * 10 * 4 and fp32["head"] == 0  # the tied weight counts once
    assert fp32["blocks.0"] == 2 * _linear_bytes(10)
    half = compute_module_sizes(model, dtype="float16")
    assert half["blocks.0"] == fp32["blocks.0"] // 2
    assert half["steps"] == 40  # integer buffers are not converted
    special = compute_module_sizes(model, dtype=torch.bfloat16,
                                   special_dtypes={"blocks.0.a.weight": "float32"})
    assert special["blocks.0.a"] == 400 + 20 and special["blocks.0.b"] == 220
    assert fp32[""] == sum(t.numel() * t.element_size() for t in
                           {id(t): t for t in [*model.parameters(), *model.buffers()]}.values())
    with pytest.raises(ValueError, match="not a torch dtype"):
        compute_module_sizes(model, dtype="float99")


def test_max_layer_size_treats_no_split_blocks_as_layers() -> None:
    model = TinyLM(vocab=10, width=10, depth=2)
    sizes = compute_module_sizes(model)
    top = list(model.named_children())
    assert get_max_layer_size(top, sizes, []) == (_linear_bytes(10), [
        "blocks.0.a", "blocks.0.b", "blocks.1.a", "blocks.1.b"])
    assert get_max_layer_size(top, sizes, ["Block"]) == (2 * _linear_bytes(10),
                                                         ["blocks.0", "blocks.1"])


# ------------------------------------------------------------------ device maps


def _layers(width: int, depth: int) -> nn.Sequential:
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)])


def test_devices_fill_in_order_keeping_room_for_the_largest_layer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_gpus(monkeypatch, 2)
    layer = _linear_bytes(100)  # 40400 bytes
    model = _layers(100, 8)
    # GPU 0 is a main device: 3 layers fit but one layer's room is kept -> 2 layers;
    # GPU 1 takes 2; the CPU (main too) 1 of its 2; the rest goes to disk.
    device_map = infer_auto_device_map(model, {0: 3 * layer + 10, 1: 2 * layer + 10,
                                               "cpu": 2 * layer + 10})
    assert isinstance(device_map, OrderedDict)
    assert dict(device_map) == {"0": 0, "1": 0, "2": 1, "3": 1, "4": "cpu", "5": "disk",
                                "6": "disk", "7": "disk"}
    check_device_map(model, device_map)


def test_maps_match_accelerate(monkeypatch: pytest.MonkeyPatch) -> None:
    modeling = pytest.importorskip("accelerate.utils.modeling", reason="pip install '.[test]'")
    _fake_gpus(monkeypatch, 2)
    block = 2 * _linear_bytes(10)
    cases = [
        (TinyLM(100, 10, 6), None, {0: 6000, 1: 3000, "cpu": 3000}),
        (TinyLM(100, 10, 6), ["Block"], {0: 6000, 1: 3000, "cpu": 3000}),
        (TinyLM(100, 10, 6), ["Block"], {0: 4000 + 3 * block, "cpu": 2 * block}),
        (TinyLM(30, 10, 6), ["Block"], {"cpu": 1200 + 3 * block}),
        (_layers(100, 8), None, {0: 100_000, 1: 100_000, "cpu": 50_000}),
        (nn.Sequential(_layers(10, 3), _layers(20, 2), _layers(5, 4)), None,
         {0: 3000, 1: 2000, "cpu": 2000}),
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Accelerate warns that GPUs 0 and 1 are not here
        for model, no_split, limits in cases:
            ours = infer_auto_device_map(model, dict(limits), no_split_module_classes=no_split)
            theirs = modeling.infer_auto_device_map(model, dict(limits),
                                                    no_split_module_classes=no_split)
            assert dict(ours) == dict(theirs), (limits, no_split)
            assert set(ours.values()) != {next(iter(ours.values()))}  # a real split


def test_no_split_blocks_are_never_split() -> None:
    model = TinyLM(vocab=10, width=10, depth=4)
    limits = {"cpu": 1500}  # the embedding and head (400 bytes) and one and a half blocks
    split = infer_auto_device_map(model, limits)
    assert any(key.count(".") == 2 for key in split)  # blocks.N.a: a block was cut in two
    whole = infer_auto_device_map(model, limits, no_split_module_classes=["Block"])
    assert all(key.count(".") <= 1 for key in whole), whole
    assert set(whole.values()) == {"cpu", "disk"}
    check_device_map(model, whole)


def test_tied_weights_go_to_the_same_device(monkeypatch: pytest.MonkeyPatch) -> None:
    model = TinyLM(vocab=1000, width=10, depth=4)  # the embedding is the big part
    assert find_tied_parameters(model) == [["embed.weight", "head.weight"]]
    embed = 1000 * 10 * 4
    block = 2 * _linear_bytes(10)
    limits = {"cpu": embed + 3 * block + 100}
    # The head comes last, after blocks that spill to disk: tied, it stays with the embedding;
    # untied (its own copy of the weight), it goes to disk with its neighbours.
    tied = infer_auto_device_map(model, limits, no_split_module_classes=["Block"])
    assert tied["head"] == tied["embed"] == "cpu" and tied["blocks.3"] == "disk"
    untied = infer_auto_device_map(TinyLM(1000, 10, 4, tied=False),  # room kept: the head
                                   {"cpu": 2 * embed + 2 * block}, ["Block"])
    assert untied["embed"] == "cpu" and untied["head"] == "disk"
    # On GPUs: GPU 0 has room for the embedding alone but not with its tied head (whose bias
    # is 4000 bytes), so the pair moves to GPU 1 together.
    _fake_gpus(monkeypatch, 2)
    model = TinyLM(vocab=1000, width=10, depth=4, head_bias=True)
    limits = {0: embed + block + 2000, 1: embed + 4000 + block + 100, "cpu": 10 * embed}
    device_map = infer_auto_device_map(model, limits, no_split_module_classes=["Block"])
    assert dict(device_map) == {"embed": 1, "head": 1, "blocks.0": 1, "blocks.1": "cpu",
                                "blocks.2": "cpu", "blocks.3": "cpu", "norm": "cpu"}
    modeling = pytest.importorskip("accelerate.utils.modeling", reason="pip install '.[test]'")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert dict(device_map) == dict(modeling.infer_auto_device_map(model, limits, ["Block"]))


def test_dtype_decides_what_fits() -> None:
    model = _layers(100, 4)
    limits = {"cpu": 4 * _linear_bytes(100, 2) + _linear_bytes(100, 2)}
    assert set(infer_auto_device_map(model, limits).values()) == {"cpu", "disk"}
    assert dict(infer_auto_device_map(model, limits, dtype=torch.bfloat16)) == {"": "cpu"}
    # special_dtypes keep one layer in float32: it no longer all fits
    keep = {"3.weight": torch.float32, "2.weight": torch.float32}
    spilled = infer_auto_device_map(model, limits, dtype="bfloat16", special_dtypes=keep)
    assert "disk" in spilled.values()


def test_disk_spill_covers_every_tensor_and_buffer() -> None:
    model = nn.Sequential(nn.Linear(50, 50), nn.BatchNorm1d(50), nn.Linear(50, 50),
                          nn.BatchNorm1d(50))
    device_map = infer_auto_device_map(model, {"cpu": 21_000}, clean_result=False)
    assert dict(device_map) == {"0": "cpu", "1": "disk", "2": "disk", "3": "disk"}
    check_device_map(model, device_map)  # running_mean, num_batches_tracked... all placed
    capped = {"cpu": 21_000, "disk": 10_000}
    with pytest.raises(ValueError, match=r"does not fit in max_memory .*'disk'"):
        infer_auto_device_map(model, capped)


def test_clean_result_collapses_children_into_their_parent() -> None:
    model = TinyLM(vocab=10, width=10, depth=4)
    limits = {"cpu": 2 * 2 * _linear_bytes(10) + 2000}
    raw = infer_auto_device_map(model, limits, clean_result=False)
    cleaned = infer_auto_device_map(model, limits)
    assert len(cleaned) < len(raw)
    for key, device in raw.items():  # the cleaned map puts every tensor where the raw one did
        owner = max((k for k in cleaned if k == "" or key == k or key.startswith(k + ".")),
                    key=len)
        assert cleaned[owner] == device
    assert clean_device_map({"a.x": 0, "a.y": 0, "b.x": "cpu", "b.y": 1, "c": 1}) == \
        {"a": 0, "b.x": "cpu", "b.y": 1, "c": 1}
    assert list(clean_device_map({"a": 0, "b.x": 1, "b.y": 1, "c": 0})) == ["a", "b", "c"]
    assert clean_device_map({"x": "cpu", "y": "cpu"}) == {"": "cpu"}


def test_verbose_prints_each_decision(capsys: pytest.CaptureFixture[str]) -> None:
    infer_auto_device_map(_layers(10, 3), {"cpu": 500}, verbose=True)
    out = capsys.readouterr().out
    assert "putting 0" in out and "on 'disk'" in out and "next device" in out


def _rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_meta_model_is_placed_without_allocating_its_weights() -> None:
    gc.collect()
    before = _rss()
    with init_empty_weights():  # 8 x 4096 x 8192 fp32 = 1.07 GB of weights, as shapes only
        model = nn.Sequential(*[nn.Linear(4096, 8192) for _ in range(8)])
    sizes = compute_module_sizes(model)
    device_map = infer_auto_device_map(model, {"cpu": "600MB"})
    balanced = get_balanced_memory(model, {"cpu": "600MB"})
    grown = _rss() - before
    assert sizes[""] == 8 * (4096 * 8192 + 8192) * 4
    assert model[0].weight.is_meta and set(device_map.values()) == {"cpu", "disk"}
    assert balanced == {"cpu": 600_000_000}
    assert grown < 50 * 2**20, f"RSS grew by {grown} bytes"


def test_check_device_map_names_unplaced_tensors() -> None:
    model = TinyLM(vocab=10, width=4, depth=2)
    with pytest.raises(ValueError, match=r"no device for blocks\.1\.a\.weight, .*norm\.bias"):
        check_device_map(model, {"embed": 0, "blocks.0": 0, "head": 0})
    with pytest.warns(UserWarning, match="do not match any submodules"):
        check_device_map(model, {"": "cpu", "nope": "cpu"})
    check_device_map(model, {"": "cpu"})


# ------------------------------------------------------------------ balanced memory


def test_balanced_memory_follows_accelerate(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_gpus(monkeypatch, 3)
    model = TinyLM(vocab=100, width=20, depth=9)
    limits = {0: "1MB", 1: "1MB", 2: "1MB", "cpu": "1GB"}
    total = compute_module_sizes(model)[""]
    got = get_balanced_memory(model, limits, no_split_module_classes=["Block"])
    margin = int(1.25 * 2 * _linear_bytes(20))
    assert got == {0: total // 3 + margin, 1: total // 3 + margin, 2: 10**6, "cpu": 10**9}
    low = get_balanced_memory(model, limits, ["Block"], low_zero=True)
    assert low[1] == total // 2 + margin and low[0] == 0
    assert get_balanced_memory(model, {0: 1000, "cpu": 5}) == {0: 1000, "cpu": 5}
    modeling = pytest.importorskip("accelerate.utils.modeling", reason="pip install '.[test]'")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for no_split in (None, ["Block"]):
            for low_zero in (False, True):
                theirs = modeling.get_balanced_memory(model, dict(limits), no_split,
                                                      low_zero=low_zero)
                ours = get_balanced_memory(model, dict(limits), no_split, low_zero=low_zero)
                assert ours == {k: int(v) for k, v in theirs.items()}, (no_split, low_zero)


def test_public_names_are_where_accelerate_users_look() -> None:
    assert accel.infer_auto_device_map is infer_auto_device_map
    for name in ("infer_auto_device_map", "get_balanced_memory", "compute_module_sizes",
                 "find_tied_parameters", "check_device_map", "convert_file_size_to_int",
                 "get_max_memory", "get_max_layer_size", "clean_device_map"):
        assert name in accel.utils.__all__ and callable(getattr(accel.utils, name))


def test_detected_budget_asks_each_gpu_and_balanced_keeps_a_tenth_free(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from accel.device import DEVICE_KINDS

    _fake_gpus(monkeypatch, 1)
    monkeypatch.setattr(DEVICE_KINDS["cuda"], "free_memory", classmethod(lambda cls, i: 1000))
    monkeypatch.setattr(budget, "host_memory_available", lambda: 5000)
    assert get_max_memory() == {0: 1000, "cpu": 5000}
    # one GPU and no max_memory: 90% of it for weights, as Accelerate does
    assert get_balanced_memory(nn.Linear(4, 4)) == {0: 900, "cpu": 5000}
    assert get_balanced_memory(nn.Linear(4, 4), {0: 1000}) == {0: 1000}


def test_buffers_left_on_the_gpu_by_offloaded_modules_warn(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_gpus(monkeypatch, 1)
    model = nn.Sequential(nn.Linear(10, 10), nn.BatchNorm1d(5000), nn.BatchNorm1d(5000))
    limits = {0: 1000, "cpu": 10**6}  # all to the CPU; the norms hold 80 kB of buffers
    with pytest.warns(UserWarning, match="offload_buffers=True"):
        device_map = infer_auto_device_map(model, limits)
    assert dict(device_map) == {"": "cpu"}  # GPU 0 keeps room for a norm: too small
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        infer_auto_device_map(model, limits, offload_buffers=True)


# ------------------------------------------------------------------ fallback allocation


def _nested_three() -> nn.Module:
    inner = nn.Sequential(OrderedDict([("linear1", nn.Linear(10, 4)),  # 176 bytes
                                       ("linear2", nn.Linear(4, 4)),  # 80 bytes
                                       ("linear3", nn.Linear(4, 8))]))  # 160 bytes
    return nn.Sequential(OrderedDict([("module", inner)]))


def test_fallback_allocation_places_a_smaller_part_on_an_empty_device(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    _fake_gpus(monkeypatch, 1)
    model = _nested_three()
    with caplog.at_level("INFO", logger="accel.big_modeling.placement"):
        plain = infer_auto_device_map(model, {0: 256})
    assert 0 not in plain.values() and "insufficient memory" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="accel.big_modeling.placement"):
        got = infer_auto_device_map(model, {0: 256}, fallback_allocation=True)
    assert dict(got) == {"module.linear1": "disk", "module.linear2": 0, "module.linear3": "disk"}
    assert "insufficient memory" not in caplog.text


def test_fallback_allocation_leaves_the_device_empty_when_nothing_fits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_gpus(monkeypatch, 1)
    got = infer_auto_device_map(_nested_three(), {0: 30}, fallback_allocation=True)
    assert dict(got) == {"": "disk"}


def test_buffer_warning_counts_the_room_kept_for_offloaded_layers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_gpus(monkeypatch, 1)
    model = nn.Sequential(OrderedDict([("linear1", nn.Linear(10, 10)),
                                       ("batchnorm", nn.BatchNorm1d(10)),
                                       ("linear2", nn.Linear(10, 10))]))
    for i, name in enumerate(("linear1", "batchnorm", "linear2")):
        model.get_submodule(name).register_buffer(f"buffer{i}", torch.zeros(5))
    with pytest.warns(UserWarning, match="offload_buffers=True"):
        got = infer_auto_device_map(model, {0: 678}, fallback_allocation=True)
    assert dict(got) == {"linear1": "disk", "batchnorm": 0, "linear2": "disk"}
