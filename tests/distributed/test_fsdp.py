"""FSDP2 training through ``Accelerator(fsdp_plugin=...)`` with real processes (CPU, gloo).

A small transformer-like model (embedding, blocks, a head tied to the embedding) trained by 2
FSDP processes, each on half of every batch, must end with the parameters of one process
trained on the whole batch (plain PyTorch, computed in the same worker): fp32 within 1e-5, with
and without gradient accumulation, with ``clip_grad_norm_`` (the norm too), whichever order the
model and optimizer are prepared in; with a bf16 policy within a stated tolerance. 4 processes
on a 2 × 2 mesh (HSDP) give the same parameters too. One spawn checks many things.
"""

from __future__ import annotations

import gc
import warnings
import weakref
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.spawn import run_workers

VOCAB, DIM, SEQ, N, BATCH = 16, 8, 4, 32, 8  # BATCH: the whole batch of one step
STEPS = N // BATCH


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(DIM, DIM)
        self.norm = nn.LayerNorm(DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + torch.tanh(self.lin(x)))


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.Sequential(Block(), Block(), Block())
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens)))


def _data() -> TensorDataset:
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, VOCAB, (N, SEQ), generator=gen)
    return TensorDataset(tokens, torch.roll(tokens, 1, dims=1))


def _loss(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())


def _reference(accumulate: int = 1, clip: float | None = None
               ) -> tuple[dict[str, Any], list[float]]:
    """One process, the whole batch, plain PyTorch: the parameters to match, and the norms."""
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    norms = []
    loader = DataLoader(_data(), batch_size=BATCH // accumulate)
    for i, (tokens, targets) in enumerate(loader):
        (_loss(model, tokens, targets) / accumulate).backward()
        if (i + 1) % accumulate == 0:
            if clip is not None:
                norms.append(float(nn.utils.clip_grad_norm_(model.parameters(), clip)))
            opt.step()
            opt.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, norms


def _train(order: str, accumulate: int = 1, clip: float | None = None,
           mixed_precision: str = "no", parallelism: Any = None, device: str | None = "cpu",
           save_to: str | None = None, **plugin_kwargs: Any
           ) -> tuple[dict[str, torch.Tensor], list[float], dict[str, Any]]:
    """Train TinyLM with accel FSDP (``device=None``: the default device, a GPU if any), and
    ``save_state(save_to)`` at the end when given."""
    from accel import Accelerator, DistributedType, FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(**(plugin_kwargs or {
        "auto_wrap_policy": "transformer_based_wrap", "transformer_cls_names_to_wrap": ["Block"]}))
    acc = Accelerator(cpu=device == "cpu", fsdp_plugin=plugin,
                      gradient_accumulation_steps=accumulate,
                      mixed_precision=mixed_precision, parallelism_config=parallelism)
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    world = acc.num_processes
    loader = DataLoader(_data(), batch_size=BATCH // accumulate // world)
    unsharded = weakref.ref(model.blocks[0].lin.weight)  # a full parameter before sharding
    if order == "together":
        model, opt, loader = acc.prepare(model, opt, loader)
    elif order == "optimizer_first":
        opt, loader = acc.prepare(opt, loader)
        model = acc.prepare(model)
    else:
        model = acc.prepare(model)
        opt, loader = acc.prepare(opt, loader)
    facts: dict[str, Any] = {
        "type": acc.distributed_type == DistributedType.FSDP, "fsdp2": acc.is_fsdp2,
        "plugin": acc.state.fsdp_plugin is plugin,
        "opt_sees_shards": all(any(p is q for q in model.parameters())
                               for g in opt.param_groups for p in g["params"]),
        "dtensor": type(next(model.parameters())).__name__,
        # nothing (accel's record of replaced parameters included) keeps a full copy alive
        "unsharded_freed": gc.collect() >= 0 and unsharded() is None,
    }
    from torch.distributed.fsdp import FSDPModule

    facts["mesh"] = tuple(acc.torch_device_mesh.shape)
    facts["shard_device"] = next(model.parameters()).to_local().device.type
    facts["shard_rank"] = acc.data_parallel_shard_rank
    calls = [0]
    model.blocks[0].lin.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    facts["units"] = sum(isinstance(m, FSDPModule) for m in model.modules())
    norms, held, kept = [], [], []
    for tokens, targets in loader:
        with acc.accumulate(model):
            loss = _loss(model, tokens, targets)
            # between forward and backward the root keeps its gathered (plain) parameters, as
            # fully_shard's default has it, while the blocks are resharded: no extra all-gather
            kept.append(type(model.embed.weight).__name__ == "Parameter"
                        and type(model.blocks[0].lin.weight).__name__ == "DTensor")
            acc.backward(loss)
            # a micro-step that does not sync keeps its gradient unreduced inside FSDP
            held.append(acc.sync_gradients or all(p.grad is None for p in model.parameters()))
            if acc.sync_gradients and clip is not None:
                norms.append(float(acc.clip_grad_norm_(model.parameters(), clip)))
            opt.step()
            opt.zero_grad()
    facts["no_sync_held"] = all(held)
    refused = []
    for obj in (model, model.state_dict()):  # shards: refused on every rank, naming the way
        try:
            acc.save(obj, "unused.safetensors")
        except ValueError as exc:
            refused.append("get_state_dict(model) on every rank" in str(exc))
    facts["save_refuses_shards"] = refused == [True, True]
    facts["block_forwards_per_batch"] = calls[0] / len(loader)
    facts["root_kept_after_forward"] = all(kept)
    if save_to is not None:
        acc.save_state(save_to)
    full = acc.get_state_dict(model)
    facts["unwrapped_is_model"] = acc.unwrap_model(model) is model
    return full, norms, facts


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b), (sorted(a), sorted(b))
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def _fsdp_worker(rank: int) -> dict[str, Any]:
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    out: dict[str, Any] = {}
    ref, _ = _reference()
    for order in ("together", "optimizer_first", "model_first"):
        full, _, facts = _train(order)
        out[order] = (_close(full, ref) if rank == 0 else len(full), facts)
    ref_acc, _ = _reference(accumulate=2)
    full, _, facts = _train("together", accumulate=2)
    out["accumulate"] = (_close(full, ref_acc) if rank == 0 else len(full), facts["no_sync_held"])
    ref_clip, ref_norms = _reference(clip=0.5)
    full, norms, _ = _train("together", clip=0.5)
    out["clip"] = (_close(full, ref_clip) if rank == 0 else len(full),
                   max(abs(a - b) for a, b in zip(norms, ref_norms, strict=True)))
    full, _, _ = _train("together", mixed_precision="bf16")
    out["bf16"] = _close(full, ref) if rank == 0 else len(full)
    out["variants"] = _variants(rank, ref)
    out["sync_module_states"] = {sync: _starts_from_rank0(rank, sync) for sync in (True, False)}
    return out


def _starts_from_rank0(rank: int, sync: bool) -> bool | None:
    """Ranks that initialise differently (seeded by rank) all start from rank 0's weights,
    as under DDP, unless ``sync_module_states=False``: whether rank 0's gathered model equals
    its own initial one (None on other ranks)."""
    from accel import Accelerator, FullyShardedDataParallelPlugin

    acc = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(
        transformer_cls_names_to_wrap=["Block"], sync_module_states=sync))
    torch.manual_seed(rank)
    model = TinyLM()
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    full = acc.get_state_dict(acc.prepare(model))
    return _close(full, initial) == 0 if rank == 0 else None


def _variants(rank: int, ref: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Plugin settings that change how, not what, the model trains: each must match ``ref``."""
    variants: dict[str, dict[str, Any]] = {
        # recomputes each block's forward in backward
        "activation_checkpointing": {"transformer_cls_names_to_wrap": ["Block"],
                                     "activation_checkpointing": True},
        "reshard_after_forward_false": {"transformer_cls_names_to_wrap": ["Block"],
                                        "reshard_after_forward": False},
        # the embedding (128 parameters) qualifies, but its weight is tied to the head: it must
        # stay in the root's unit, not become one that hands the head a shard
        "size_based": {"auto_wrap_policy": "size_based_wrap", "min_num_params": 50},
        "no_wrap": {"auto_wrap_policy": "no_wrap"},
        # trainable but not sharded: its gradients must still be averaged over the ranks
        "ignored_regex": {"transformer_cls_names_to_wrap": ["Block"],
                          "ignored_modules": r"blocks\.1\.norm"},
        "cpu_offload_on_cpu": {"transformer_cls_names_to_wrap": ["Block"], "cpu_offload": True},
    }
    out: dict[str, Any] = {}
    for name, kwargs in variants.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            full, _, facts = _train("together", **kwargs)
        out[name] = {"diff": _close(full, ref) if rank == 0 else len(full),
                     "units": facts["units"], "forwards": facts["block_forwards_per_batch"],
                     "warned": any("no effect on a CPU run" in str(w.message) for w in caught)}
    return out


def test_fsdp_two_processes_match_one_process_on_the_whole_batch() -> None:
    results = run_workers(_fsdp_worker, 2, timeout=240)
    main, other = results
    for order in ("together", "optimizer_first", "model_first"):
        diff, facts = main[order]
        assert diff <= 1e-5, (order, diff)
        assert facts == {"type": True, "fsdp2": True, "plugin": True, "opt_sees_shards": True,
                         "dtensor": "DTensor", "unsharded_freed": True, "mesh": (2,),
                         "shard_rank": 0, "units": 4,
                         "no_sync_held": True, "shard_device": "cpu",
                         "block_forwards_per_batch": 1.0, "save_refuses_shards": True,
                         "unwrapped_is_model": True, "root_kept_after_forward": True
                         }, (order, facts)
        assert other[order][0] == 0  # the full state dict is gathered on rank 0 only
        assert other[order][1]["shard_rank"] == 1
    assert main["accumulate"][0] <= 1e-5 and main["accumulate"][1], main["accumulate"]
    assert main["clip"][0] <= 1e-5 and main["clip"][1] <= 1e-5, main["clip"]
    # bf16 parameters and reductions for 4 AdamW steps at lr 1e-2: bf16 rounding (8 bits of
    # mantissa, relative 4e-3) of weights of order 1 moves them by a few 1e-3
    assert main["bf16"] <= 2e-2, main["bf16"]
    variants = main["variants"]
    assert all(v["diff"] <= 1e-5 for v in variants.values()), variants
    assert all(v["diff"] == 0 for v in other["variants"].values()), other["variants"]
    units = {name: v["units"] for name, v in variants.items()}
    # size-based: the blocks' Linear layers (72 parameters each) and the root, never the tied
    # embedding (128)
    assert units == {"activation_checkpointing": 4, "reshard_after_forward_false": 4,
                     "size_based": 4, "no_wrap": 1, "ignored_regex": 4,
                     "cpu_offload_on_cpu": 4}, units
    assert variants["activation_checkpointing"]["forwards"] == 2.0, variants
    assert variants["no_wrap"]["forwards"] == 1.0, variants
    assert variants["cpu_offload_on_cpu"]["warned"], variants
    # rank 1's shards hold rank 0's initial weights only when module states are synced
    assert main["sync_module_states"] == {True: True, False: False}, main["sync_module_states"]


def _hsdp_worker(rank: int, root: str) -> dict[str, Any]:
    from accel import ParallelismConfig

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    ref, _ = _reference()
    full, _, facts = _train("together", parallelism=ParallelismConfig(dp_replicate_size=2,
                                                                        dp_shard_size=2),
                            save_to=f"{root}/hsdp")
    return {"diff": _close(full, ref) if rank == 0 else len(full), "facts": facts}


def _load_hsdp_worker(rank: int, root: str) -> dict[str, Any]:
    """Load the 2 x 2 mesh's sharded checkpoint at 2 processes (a 1-D mesh)."""
    from accel import Accelerator, FullyShardedDataParallelPlugin

    warnings.simplefilter("ignore")
    acc = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(
        transformer_cls_names_to_wrap=["Block"]))
    torch.manual_seed(7)  # other weights: the checkpoint must replace them
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    acc.load_state(f"{root}/hsdp")
    steps = {int(state["step"]) for state in opt.optimizer.state.values()}
    full = acc.get_state_dict(model)
    ref, _ = _reference()
    return {"diff": _close(full, ref) if rank == 0 else len(full), "steps": steps}


def test_hsdp_on_a_two_by_two_mesh_matches_one_process(tmp_path: Path) -> None:
    results = run_workers(_hsdp_worker, 4, args=(str(tmp_path),), timeout=300)
    assert results[0]["diff"] <= 1e-5, results[0]
    assert all(r["diff"] == 0 for r in results[1:]), results
    # rows replicate, columns shard: ranks 0, 2 hold the first half of each parameter
    assert [r["facts"]["shard_rank"] for r in results] == [0, 1, 0, 1]
    facts = results[0]["facts"]
    assert facts["mesh"] == (2, 2) and facts["units"] == 4 and facts["opt_sees_shards"], facts
    # its sharded checkpoint (replicas split the writing) loads on a 1-D mesh of 2 processes
    loaded = run_workers(_load_hsdp_worker, 2, args=(str(tmp_path),), timeout=300)
    assert loaded[0]["diff"] <= 1e-5 and loaded[1]["diff"] == 0, loaded
    assert all(r["steps"] == {STEPS} for r in loaded), loaded


def _single_worker(rank: int) -> dict[str, Any]:
    from accel import ParallelismConfig

    warnings.simplefilter("ignore")
    ref, _ = _reference()
    full, _, facts = _train("together", parallelism=ParallelismConfig(dp_shard_size=1))
    return {"diff": _close(full, ref), "facts": facts}


def test_fsdp_on_one_process_with_an_explicit_mesh() -> None:
    result = run_workers(_single_worker, 1, timeout=120)[0]
    assert result["diff"] <= 1e-5, result
    assert result["facts"]["type"] and result["facts"]["dtensor"] == "DTensor"
    assert result["facts"]["mesh"] == (1,)


def _main_only_save_worker(rank: int, root: str) -> dict[str, Any]:
    """save_state() under `if is_main_process:` with FSDP: refused at once on rank 0 (sharded
    state needs every rank), no rank left waiting; saves on every rank still work after it."""
    import time

    from accel import Accelerator, FullyShardedDataParallelPlugin
    from accel.checkpoint import CheckpointError

    warnings.simplefilter("ignore")
    acc = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(
        transformer_cls_names_to_wrap=["Block"]))
    torch.manual_seed(0)
    model = TinyLM()
    model, opt = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    out: dict[str, Any] = {}
    if acc.is_main_process:
        start = time.monotonic()
        try:
            acc.save_state(f"{root}/alone")
        except CheckpointError as exc:
            out["refused"] = "call save_state() on every process" in str(exc)
        out["seconds"] = time.monotonic() - start
    acc.wait_for_everyone()  # rank 1 went on: rank 0 saw it pass the save
    out["saved"] = [Path(acc.save_state(f"{root}/all_{i}")).name for i in range(2)]
    return out


def test_main_process_only_save_state_is_refused_with_fsdp(tmp_path: Path) -> None:
    results = run_workers(_main_only_save_worker, 2, args=(str(tmp_path),), timeout=120)
    assert results[0]["refused"] and results[0]["seconds"] < 10, results[0]
    assert all(r["saved"] == ["all_0", "all_1"] for r in results), results
    assert not (tmp_path / "alone").exists()
