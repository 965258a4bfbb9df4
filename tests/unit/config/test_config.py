"""accel.config: mixed-precision names, timeouts, kwargs handlers and configuration dataclasses."""

from __future__ import annotations

from datetime import timedelta

import pytest

from accel.config import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    PrecisionType,
    ProjectConfiguration,
    parse_mixed_precision,
    to_timedelta,
)


@pytest.mark.parametrize("value,expected", [
    (None, PrecisionType.NO), ("no", PrecisionType.NO), ("", PrecisionType.NO),
    ("none", PrecisionType.NO), ("fp32", PrecisionType.NO), ("fp16", PrecisionType.FP16),
    (" FP16 ", PrecisionType.FP16), ("float16", PrecisionType.FP16), ("bf16", PrecisionType.BF16),
    ("BFloat16", PrecisionType.BF16), (PrecisionType.BF16, PrecisionType.BF16),
])
def test_parse_mixed_precision_accepts(value: str | PrecisionType | None,
                                       expected: PrecisionType) -> None:
    assert parse_mixed_precision(value) is expected


@pytest.mark.parametrize("value", ["fp8", "half", "16", "bf-16"])
def test_parse_mixed_precision_rejects_unknown_names(value: str) -> None:
    with pytest.raises(ValueError, match=f"unknown mixed_precision '{value}'.*'no', 'fp16', 'bf16'"):
        parse_mixed_precision(value)


@pytest.mark.parametrize("value", [16, True, 1.0])
def test_parse_mixed_precision_rejects_non_strings(value: object) -> None:
    with pytest.raises(TypeError, match="mixed_precision must be a string"):
        parse_mixed_precision(value)  # type: ignore[arg-type]


def test_precision_values_match_accelerate() -> None:
    assert [p.value for p in PrecisionType] == ["no", "fp16", "bf16"]
    assert PrecisionType.FP16 == "fp16"


@pytest.mark.parametrize("value,expected", [
    (None, None), (30, timedelta(seconds=30)), (1.5, timedelta(seconds=1.5)),
    (timedelta(minutes=2), timedelta(minutes=2)),
])
def test_to_timedelta_accepts(value: float | timedelta | None,
                              expected: timedelta | None) -> None:
    assert to_timedelta(value) == expected


@pytest.mark.parametrize("value", [0, -1, timedelta(0), timedelta(seconds=-3)])
def test_to_timedelta_rejects_non_positive(value: float | timedelta) -> None:
    with pytest.raises(ValueError, match="stall must be positive"):
        to_timedelta(value, name="stall")


@pytest.mark.parametrize("value", [True, "30", [30]])
def test_to_timedelta_rejects_other_types(value: object) -> None:
    with pytest.raises(TypeError, match="timeout must be seconds"):
        to_timedelta(value)  # type: ignore[arg-type]


def test_dataloader_configuration_dispatch_batches() -> None:
    """dispatch_batches=True prepares loaders that rank 0 reads (tests/distributed has the
    multi-process behaviour); the default, None, has every rank read its own shard."""
    from torch.utils.data import DataLoader

    from accel import Accelerator
    from accel.data_loader import DataLoaderDispatcher, DataLoaderShard

    config = DataLoaderConfiguration(dispatch_batches=True)
    accelerator = Accelerator(cpu=True, dataloader_config=config)
    assert accelerator.dispatch_batches is True
    loader = accelerator.prepare(DataLoader(list(range(5)), batch_size=2))
    assert isinstance(loader, DataLoaderDispatcher) and isinstance(loader, DataLoaderShard)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4]]
    assert accelerator.gather_for_metrics(next(iter(loader))).tolist() == [0, 1]
    plain = Accelerator(cpu=True)
    assert plain.dispatch_batches is False
    assert not isinstance(plain.prepare(DataLoader(list(range(4)))), DataLoaderDispatcher)
    assert DataLoaderConfiguration(dispatch_batches=False).dispatch_batches is False
    assert DataLoaderConfiguration().even_batches is True


def test_dataloader_configuration_checks_data_seed() -> None:
    assert DataLoaderConfiguration(data_seed=3).data_seed == 3
    with pytest.raises(TypeError, match="data_seed must be an int"):
        DataLoaderConfiguration(data_seed="3")  # type: ignore[arg-type]


@pytest.mark.parametrize("steps", [0, -2, 1.5, True, "2"])
def test_gradient_accumulation_plugin_rejects_bad_steps(steps: object) -> None:
    with pytest.raises(ValueError, match="num_steps must be an integer >= 1"):
        GradientAccumulationPlugin(num_steps=steps)  # type: ignore[arg-type]


def test_gradient_accumulation_plugin_accepts_steps_and_none() -> None:
    assert GradientAccumulationPlugin().num_steps is None
    plugin = GradientAccumulationPlugin(num_steps=4, sync_with_dataloader=False)
    assert plugin.to_kwargs() == {"num_steps": 4, "sync_with_dataloader": False}


def test_kwargs_handlers_return_only_changed_fields() -> None:
    assert DistributedDataParallelKwargs().to_kwargs() == {}
    ddp = DistributedDataParallelKwargs(find_unused_parameters=True, bucket_cap_mb=50)
    assert ddp.to_kwargs() == {"find_unused_parameters": True, "bucket_cap_mb": 50}
    assert GradScalerKwargs(init_scale=1024.0).to_kwargs() == {"init_scale": 1024.0}
    assert AutocastKwargs(cache_enabled=False).to_kwargs() == {"cache_enabled": False}
    timeout = timedelta(seconds=5)
    pg = InitProcessGroupKwargs(backend="gloo", timeout=timeout)
    assert pg.to_kwargs() == {"backend": "gloo", "timeout": timeout}


def test_project_configuration() -> None:
    assert ProjectConfiguration(project_dir="runs").logging_dir == "runs"
    assert ProjectConfiguration(project_dir="runs", logging_dir="logs").logging_dir == "logs"
    assert ProjectConfiguration().logging_dir is None
    with pytest.raises(ValueError, match="total_limit must be >= 1"):
        ProjectConfiguration(total_limit=0)
