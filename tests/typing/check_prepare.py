"""What a user's type checker sees of ``Accelerator.prepare`` (checked by mypy in ``.ci/lint``).

Not a pytest file: mypy reads it. ``assert_type`` fails the check when an overload changes, and
the ``type: ignore`` on the miscounted unpacking fails it (``warn_unused_ignores``) when the
overloads stop catching that mistake.
"""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import assert_type

from accel import Accelerator


def usual_script(accelerator: Accelerator) -> None:
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(4, 2)))
    # reassigning to the same names type-checks (the elements are Any)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    model = accelerator.prepare(model)
    assert_type(accelerator.prepare(), tuple[()])
    assert_type(accelerator.prepare(model), Any)
    assert_type(accelerator.prepare(model, optimizer), tuple[Any, Any])
    assert_type(accelerator.prepare(model, optimizer, loader, loader, None, None),
                tuple[Any, Any, Any, Any, Any, Any])
    assert_type(accelerator.prepare(model, optimizer, loader, loader, None, None, None),
                tuple[Any, ...])
    assert_type(accelerator.prepare(model, optimizer, device_placement=[True, True]),
                tuple[Any, Any])


def miscounted(accelerator: Accelerator, model: torch.nn.Module,
               optimizer: torch.optim.Optimizer) -> None:
    model, optimizer, scheduler = accelerator.prepare(model, optimizer)  # type: ignore[misc]
