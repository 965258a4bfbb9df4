"""Accelerate's views of what an ``Accelerator`` prepared: ``_models``/``_optimizers``/
``_schedulers``/``_dataloaders`` and the ``_is_accelerate_prepared`` marker."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator


def _components() -> tuple[torch.nn.Module, torch.optim.Optimizer, object, DataLoader[object]]:
    model = torch.nn.Linear(2, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    loader: DataLoader[object] = DataLoader(TensorDataset(torch.arange(4.0)))
    return model, optimizer, scheduler, loader


def test_prepared_lists_are_read_only_snapshots_emptied_by_free_memory() -> None:
    acc = Accelerator(cpu=True)
    model, opt, sched, loader = acc.prepare(*_components())
    assert acc._models == (model,)
    assert acc._optimizers == (opt,)
    assert acc._schedulers == (sched,)
    assert acc._dataloaders == (loader,)
    with pytest.raises(AttributeError):
        acc._models.append(model)  # type: ignore[attr-defined]
    acc.free_memory()
    assert (acc._models, acc._optimizers, acc._schedulers, acc._dataloaders) == ((),) * 4


def test_prepared_objects_are_marked_and_others_left_alone() -> None:
    acc = Accelerator(cpu=True)

    class Passenger:
        pass

    passenger = Passenger()
    *prepared, out = acc.prepare(*_components(), passenger)
    assert all(getattr(obj, "_is_accelerate_prepared", False) is True for obj in prepared)
    assert out is passenger and not hasattr(passenger, "_is_accelerate_prepared")
    model = acc.prepare_model(torch.nn.Linear(1, 1))
    loader = acc.prepare_data_loader(DataLoader(TensorDataset(torch.arange(2.0))))
    assert model._is_accelerate_prepared is True and loader._is_accelerate_prepared is True


def test_prepare_model_twice_returns_the_same_model_once_registered() -> None:
    acc = Accelerator(cpu=True)
    model = acc.prepare_model(torch.nn.Linear(2, 2))
    assert acc.prepare_model(model) is model
    assert acc.prepare(model) is model
    assert acc._models == (model,)
