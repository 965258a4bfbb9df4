"""``accel.spawn``'s argument rules (Paddle's), without starting processes."""

from __future__ import annotations

import pytest

import accel
from accel import launch as launch_package
from accel.device.cuda import CUDADevice
from accel.launch import spawning as spawn_module
from accel.launch.spawning import _check_options, _device_and_nprocs, _gpu_list, _machines


def test_spawn_is_exported_lazily() -> None:
    assert accel.spawn is spawn_module.spawn
    assert "spawn" in accel.__all__
    assert launch_package.spawn is spawn_module.spawn


def test_options_start_method_and_backend() -> None:
    assert _check_options({}) == ("spawn", None)  # Paddle's default start method
    assert _check_options({"start_method": "fork", "backend": "gloo"}) == ("fork", "cpu")
    assert _check_options({"backend": "nccl"})[1] == "cuda"
    with pytest.raises(ValueError, match=r"unsupported option\(s\) foo, xpus \(accel has no "
                       r"XPU support.*supported: start_method, gpus"):
        _check_options({"xpus": "0", "foo": 1})
    with pytest.raises(ValueError, match=r"start_method='thread'; expected one of spawn, fork"):
        _check_options({"start_method": "thread"})
    with pytest.raises(ValueError, match=r"backend='bkcl'; expected auto, nccl .* or gloo"):
        _check_options({"backend": "bkcl"})


def test_gpus_and_selected_devices() -> None:
    assert _gpu_list({"gpus": " 0, 2"}) == "0,2"
    assert _gpu_list({"selected_devices": [1, 3]}) == "1,3"
    assert _gpu_list({"gpus": "1", "selected_devices": "1"}) == "1"
    assert _gpu_list({}) is None
    with pytest.raises(ValueError, match="contradict each other; pass only gpus"):
        _gpu_list({"gpus": "0", "selected_devices": "1"})
    with pytest.raises(ValueError, match="not a list of GPU indices"):
        _gpu_list({"gpus": "a,b"})


def test_nprocs_follows_the_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CUDADevice, "count", staticmethod(lambda: 4))
    assert _device_and_nprocs(-1, None, None) == ("cuda", 4)
    assert _device_and_nprocs(-1, None, "1,3") == ("cuda", 2)
    assert _device_and_nprocs(2, None, None) == ("cuda", 2)
    assert _device_and_nprocs(-1, "cpu", None) == ("cpu", 1)  # backend="gloo" on a GPU machine
    with pytest.raises(ValueError, match=r"nprocs=3 but gpus='1,3' lists 2 GPU\(s\); pass "
                       r"nprocs=2 \(or -1\)"):
        _device_and_nprocs(3, None, "1,3")
    with pytest.raises(ValueError, match=r"only 4 GPU\(s\) are visible; pass nprocs=4 or fewer"):
        _device_and_nprocs(5, None, None)
    with pytest.raises(ValueError, match=r"gpus='0,7' names a GPU that is not visible"):
        _device_and_nprocs(-1, None, "0,7")
    monkeypatch.setattr(CUDADevice, "count", staticmethod(lambda: 0))
    assert _device_and_nprocs(-1, None, None) == ("cpu", 1)  # Paddle: one per core; accel: 1
    assert _device_and_nprocs(3, None, None) == ("cpu", 3)
    with pytest.raises(ValueError, match="backend='nccl' needs GPUs but none is visible"):
        _device_and_nprocs(-1, "cuda", None)


def test_ips_give_the_machines_and_this_machines_rank() -> None:
    assert _machines(None) == (1, 0, "127.0.0.1")
    assert _machines("127.0.0.1") == (1, 0, "127.0.0.1")
    assert _machines("192.0.2.77, 127.0.0.1") == (2, 1, "192.0.2.77")
    with pytest.raises(ValueError, match="none of these addresses belongs to this machine"):
        _machines("192.0.2.77,10.255.0.1")
