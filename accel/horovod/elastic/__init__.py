"""``hvd.elastic``: Horovod's elastic training API on torchrun's restarts.

Run the script under ``accel launch --max_restarts N`` (and ``--nnodes min:max`` for machines
that come and go). When a worker is lost, torchrun's agent restarts the whole worker group;
``@hvd.elastic.run`` then resumes every worker from the last ``state.commit()``, which was
written to disk (``ACCEL_ELASTIC_DIR``, default ``<temp dir>/accel-elastic-<user>``) because
the survivors' memory does not outlive the restart.

Example:
    >>> import torch, accel.horovod as hvd
    >>> hvd.init()
    >>> model = torch.nn.Linear(4, 1)
    >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> sampler = hvd.elastic.ElasticSampler(list(range(8)), shuffle=False)
    >>> state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)
    >>> @hvd.elastic.run
    ... def train(state):
    ...     for state.epoch in range(state.epoch, 2):
    ...         for state.batch, index in enumerate(state.sampler):
    ...             state.sampler.record_batch(state.batch, 1)
    ...             if state.batch % 4 == 3:
    ...                 state.commit()
    ...         state.sampler.set_epoch(state.epoch + 1)
    ...     return state.epoch
    >>> train(state)
    1
    >>> hvd.shutdown()
"""

from __future__ import annotations

from ..exceptions import HorovodInternalError, HostsUpdatedInterrupt
from .runner import run
from .sampler import ElasticSampler
from .state import ObjectState, State
from .torch_state import TorchState

__all__ = ["ElasticSampler", "HorovodInternalError", "HostsUpdatedInterrupt", "ObjectState",
           "State", "TorchState", "run"]
