"""Big-model inference: disk offload against the model in memory, and checkpoint load time.

Side by side in one run, alternating which goes first, ``--repeats`` times each:

- samples per second of a forward pass (no grad) with every layer's weights in memory, and
  with every layer on ``"disk"`` (``load_checkpoint_and_dispatch`` with an offload folder:
  each layer's weights are mapped from its safetensors file for its forward only);
- load time of ``load_checkpoint_and_dispatch(model built under init_empty_weights(),
  model.safetensors, device_map={"": "cpu"})`` (building the empty model included) against
  ``model.load_state_dict(torch.load("model.pt", weights_only=True))`` into a model built
  beforehand (construction not timed). The ``.pt`` file is written for this comparison only.

Figures are min / median / max; files are read from the page cache after the first repeat.

Run:  python benchmarks/bench_big_model.py [--mb 200] [--batch 16] [--repeats 5] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from _common import add_common_args, format_seconds, interleave, machine_line, record

from accel.big_modeling import init_empty_weights, load_checkpoint_and_dispatch
from accel.checkpoint import save_model

__all__ = ["main"]

WIDTH = 1024
LOAD_TARGET = 1.5  # load_checkpoint_and_dispatch / torch.load + load_state_dict


def _build(layers: int) -> torch.nn.Module:
    return torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers))).eval()


def _spread(values: list[float]) -> str:
    ordered = sorted(values)
    mid = ordered[len(ordered) // 2]
    return " / ".join(format_seconds(v) for v in (ordered[0], mid, ordered[-1]))


def _rate(batch: int, values: list[float]) -> str:
    ordered = sorted(values)
    return f"{batch / ordered[len(ordered) // 2]:.1f} samples/s"


def _throughput(layers: int, checkpoint: Path, folder: Path, batch: int, repeats: int
                ) -> dict[str, list[float]]:
    torch.manual_seed(0)
    full = _build(layers)
    full.load_state_dict(torch.load(checkpoint.parent / "model.pt", weights_only=True))
    with init_empty_weights():
        offloaded = _build(layers)
    load_checkpoint_and_dispatch(offloaded, checkpoint, offload_folder=folder,
                                 device_map={str(i): "disk" for i in range(layers)})
    x = torch.randn(batch, WIDTH)
    with torch.no_grad():
        if not torch.equal(full(x), offloaded(x)):
            raise AssertionError("disk-offloaded outputs differ from the in-memory model's")

    def run(model: torch.nn.Module) -> Callable[[], None]:
        def forward() -> None:
            with torch.no_grad():
                model(x)
        return forward

    wall, _cpu = interleave({"in memory": run(full), "disk offload": run(offloaded)},
                            repeats=repeats, warmup=1)
    return wall


def _loading(layers: int, checkpoint: Path, repeats: int) -> dict[str, list[float]]:
    target = _build(layers)
    pt = checkpoint.parent / "model.pt"

    def torch_load() -> None:
        target.load_state_dict(torch.load(pt, weights_only=True))

    def accel_load() -> None:
        with init_empty_weights():
            model = _build(layers)
        load_checkpoint_and_dispatch(model, checkpoint, device_map={"": "cpu"})

    wall, _cpu = interleave({"torch.load+load_state_dict": torch_load,
                             "load_checkpoint_and_dispatch": accel_load},
                            repeats=repeats, warmup=1)
    return wall


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=200, help="model size in MB (fp32)")
    parser.add_argument("--batch", type=int, default=16, help="samples per forward")
    parser.add_argument("--dir", default=None, help="where the checkpoint files go")
    add_common_args(parser, repeats=5)
    args = parser.parse_args(argv)
    megabytes, repeats = (8.0, 2) if args.quick else (args.mb, max(args.repeats, 5))
    layers = max(2, round(megabytes * 1e6 / (4 * (WIDTH * WIDTH + WIDTH))))
    print(f"Big-model inference, {layers} x Linear({WIDTH}, {WIDTH}) = "
          f"{layers * 4 * (WIDTH * WIDTH + WIDTH) / 1e6:.0f} MB fp32; {machine_line()}")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        torch.manual_seed(0)
        model = _build(layers)
        checkpoint = save_model(model, save_directory=root / "ckpt", max_shard_size="10GB")
        torch.save(model.state_dict(), root / "ckpt" / "model.pt")
        del model
        forward = _throughput(layers, checkpoint, root / "offload", args.batch, repeats)
        load = _loading(layers, checkpoint, repeats)
    print(f"\nWall time per forward of {args.batch} samples (min / median / max, "
          f"{repeats} repeats)")
    for name, values in forward.items():
        print(f"  {name:<14} {_spread(values):<32} {_rate(args.batch, values)}")
    ratio = sorted(forward["disk offload"])[repeats // 2] / sorted(forward["in memory"])[
        repeats // 2]
    print(f"  disk offload / in memory: {ratio:.2f}")
    print("\nLoad time of the same checkpoint (min / median / max)")
    for name, values in load.items():
        print(f"  {name:<30} {_spread(values)}")
    ratio = sorted(load["load_checkpoint_and_dispatch"])[repeats // 2] / sorted(
        load["torch.load+load_state_dict"])[repeats // 2]
    print(f"  load_checkpoint_and_dispatch / torch: {ratio:.2f}")
    print("target: disk offload stays within a few times the in-memory forward (it reads every "
          f"weight per forward); load_checkpoint_and_dispatch / torch <= {LOAD_TARGET}")
    record("bench_big_model", f"forward of {args.batch} samples, every layer on disk",
           accel=forward["disk offload"], baseline=forward["in memory"],
           baseline_name="in memory", note="reads every weight per forward")
    record("bench_big_model", f"load of a {megabytes:.0f} MB checkpoint",
           accel=load["load_checkpoint_and_dispatch"], baseline=load["torch.load+load_state_dict"],
           baseline_name="torch.load+load_state_dict", target=LOAD_TARGET)


if __name__ == "__main__":
    main()
