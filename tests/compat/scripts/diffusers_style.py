"""A training script written for Hugging Face Accelerate the way the diffusers example trainers
are written (train_text_to_image.py and its siblings), shrunk to a tiny model and random data.

tests/compat/test_diffusers_style.py runs it unchanged under Accelerate and, with only its import
lines swapped, under accel, and compares what each trained on and produced. Patterns it keeps:
trackers initialised on the main process only and ``log`` on every rank; save/load state
pre-hooks that save the sub-model themselves (``save_pretrained``-style) and pop its weights;
``DistributedType`` checks; hooks registered only ``if version.parse(accelerate.__version__) >=
version.parse("0.16.0")`` (accel's version numbers pass such gates); the compile-aware unwrap; ``accelerator.state.*``; checkpoints saved
on the main process only; resume from the latest checkpoint, skipping finished batches by hand.
"""

import argparse
import json
import math
import os
import shutil

import accelerate
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.state import AcceleratorState
from accelerate.utils import DistributedType, ProjectConfiguration, is_compiled_module, set_seed
from packaging import version
from safetensors.torch import load_file, save_file
from torch.utils.data import DataLoader, Dataset

logger = get_logger(__name__, log_level="INFO")


class Pairs(Dataset):
    def __init__(self, n=96):
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(n, 8, generator=g)
        self.y = self.x @ torch.randn(8, 4, generator=g) + 0.1 * torch.randn(n, 4, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"pixel_values": self.x[i], "target": self.y[i], "index": i}


class TinyUNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.down = torch.nn.Linear(8, 16)
        self.up = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.up(torch.tanh(self.down(x)))

    def save_pretrained(self, path):
        os.makedirs(path, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.state_dict().items()},
                  os.path.join(path, "diffusion_pytorch_model.safetensors"))

    @classmethod
    def from_pretrained(cls, path):
        model = cls()
        model.load_state_dict(load_file(os.path.join(path, "diffusion_pytorch_model.safetensors")))
        return model


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--max_train_steps", type=int, default=8)
    parser.add_argument("--checkpointing_steps", type=int, default=3)
    parser.add_argument("--checkpoints_total_limit", type=int, default=2)
    parser.add_argument("--resume_from_checkpoint", default=None)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=2)
    parser.add_argument("--train_batch_size", type=int, default=4)
    parser.add_argument("--report_to", default="tensorboard")
    parser.add_argument("--seed", type=int, default=42)
    return parser.parse_args()


def main():
    args = parse_args()
    project_config = ProjectConfiguration(project_dir=args.output_dir,
                                          logging_dir=os.path.join(args.output_dir, "logs"))
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps,
                              mixed_precision="no", log_with=args.report_to,
                              project_config=project_config)
    logger.info(accelerator.state, main_process_only=False)
    if args.seed is not None:
        set_seed(args.seed)

    unet = TinyUNet()
    # diffusers: the EMA model and the weight dtype depend on the distributed type / precision
    weight_dtype = torch.float32
    if accelerator.mixed_precision == "fp16":
        weight_dtype = torch.float16
    elif accelerator.mixed_precision == "bf16":
        weight_dtype = torch.bfloat16
    assert accelerator.distributed_type != DistributedType.DEEPSPEED
    assert AcceleratorState().deepspeed_plugin is None or accelerator.distributed_type == DistributedType.DEEPSPEED

    def unwrap_model(model):
        model = accelerator.unwrap_model(model)
        model = model._orig_mod if is_compiled_module(model) else model
        return model

    def save_model_hook(models, weights, output_dir):
        if accelerator.is_main_process:
            for i, model in enumerate(models):
                if isinstance(unwrap_model(model), type(unwrap_model(unet))):
                    unwrap_model(model).save_pretrained(os.path.join(output_dir, "unet"))
                else:
                    raise ValueError(f"unexpected save model: {model.__class__}")
                # make sure to pop weight so that corresponding model is not saved again
                weights.pop()

    def load_model_hook(models, input_dir):
        for _ in range(len(models)):
            model = models.pop()
            load_model = TinyUNet.from_pretrained(os.path.join(input_dir, "unet"))
            unwrap_model(model).load_state_dict(load_model.state_dict())
            del load_model

    # diffusers' trainers register their hooks behind this version gate
    if version.parse(accelerate.__version__) >= version.parse("0.16.0"):
        accelerator.register_save_state_pre_hook(save_model_hook)
        accelerator.register_load_state_pre_hook(load_model_hook)

    optimizer = torch.optim.AdamW(unet.parameters(), lr=1e-2)
    train_dataloader = DataLoader(Pairs(), shuffle=True, batch_size=args.train_batch_size)
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + 0.1 * step))

    unet, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
        unet, optimizer, train_dataloader, lr_scheduler)
    unet.to(accelerator.device, dtype=weight_dtype) if weight_dtype != torch.float32 else None

    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    num_train_epochs = math.ceil(args.max_train_steps / num_update_steps_per_epoch)

    if accelerator.is_main_process:
        accelerator.init_trackers("text2image-fine-tune", config=vars(args))

    total_batch_size = args.train_batch_size * accelerator.num_processes * args.gradient_accumulation_steps
    logger.info(f"  Total train batch size = {total_batch_size}")
    global_step = 0
    first_epoch = 0
    resume_step = 0
    if args.resume_from_checkpoint:
        dirs = [d for d in os.listdir(args.output_dir) if d.startswith("checkpoint")]
        dirs = sorted(dirs, key=lambda x: int(x.split("-")[1]))
        path = dirs[-1] if len(dirs) > 0 else None
        accelerator.print(f"Resuming from checkpoint {path}")
        accelerator.load_state(os.path.join(args.output_dir, path))
        global_step = int(path.split("-")[1])
        resume_global_step = global_step * args.gradient_accumulation_steps
        first_epoch = global_step // num_update_steps_per_epoch
        resume_step = resume_global_step % (num_update_steps_per_epoch * args.gradient_accumulation_steps)

    seen, losses = [], []
    for epoch in range(first_epoch, num_train_epochs):
        unet.train()
        train_loss = 0.0
        for step, batch in enumerate(train_dataloader):
            # Skip steps until we reach the resumed step
            if args.resume_from_checkpoint and epoch == first_epoch and step < resume_step:
                continue
            with accelerator.accumulate(unet):
                pred = unet(batch["pixel_values"].to(weight_dtype))
                loss = F.mse_loss(pred.float(), batch["target"].float(), reduction="mean")
                avg_loss = accelerator.gather(loss.repeat(args.train_batch_size)).mean()
                train_loss += avg_loss.item() / args.gradient_accumulation_steps
                seen.extend(accelerator.gather(batch["index"]).tolist())
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(unet.parameters(), 1.0)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()

            if accelerator.sync_gradients:
                global_step += 1
                accelerator.log({"train_loss": train_loss}, step=global_step)
                losses.append(round(train_loss, 6))
                train_loss = 0.0

                if global_step % args.checkpointing_steps == 0:
                    if accelerator.is_main_process:
                        if args.checkpoints_total_limit is not None:
                            checkpoints = [d for d in os.listdir(args.output_dir) if d.startswith("checkpoint")]
                            checkpoints = sorted(checkpoints, key=lambda x: int(x.split("-")[1]))
                            if len(checkpoints) >= args.checkpoints_total_limit:
                                num_to_remove = len(checkpoints) - args.checkpoints_total_limit + 1
                                for removing in checkpoints[0:num_to_remove]:
                                    shutil.rmtree(os.path.join(args.output_dir, removing))
                        save_path = os.path.join(args.output_dir, f"checkpoint-{global_step}")
                        accelerator.save_state(save_path)
                        logger.info(f"Saved state to {save_path}")

            logs = {"step_loss": loss.detach().item(), "lr": lr_scheduler.get_last_lr()[0]}
            accelerator.log(logs, step=global_step)
            if global_step >= args.max_train_steps:
                break
        if global_step >= args.max_train_steps:
            break

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        unet = unwrap_model(unet)
        unet.save_pretrained(os.path.join(args.output_dir, "final"))
        report = {"seen": seen, "losses": losses, "global_step": global_step,
                  "num_processes": accelerator.state.num_processes,
                  "distributed_type": str(accelerator.distributed_type.value),
                  "trackers": [t.name for t in accelerator.trackers]}
        tag = "resumed" if args.resume_from_checkpoint else "first"
        with open(os.path.join(args.output_dir, f"report-{tag}.json"), "w") as f:
            json.dump(report, f)
    # (not in diffusers) every rank waits for the report: a rank that exits first may abort at
    # exit under plain torch.distributed, and its launcher then stops the others
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
