"""Fine-tune a tiny Hugging Face transformer built from a config (random init, no download).

Needs the optional extra: ``pip install -e '.[transformers]'``. The task is synthetic: does the
token sequence contain the "needle" token? The model returns a ``ModelOutput`` (a dict); the
evaluation gathers a dict of tensors with ``gather_for_metrics``, which keeps every sample
exactly once. The weights are saved with ``save_model`` in the file layout ``transformers``
reads (``model.safetensors``), next to the model's ``config.json``.

    accel launch --cpu -n 2 examples/transformers_tiny.py
"""

from __future__ import annotations

import argparse

import torch
from torch.utils.data import DataLoader, Dataset

from accel import Accelerator

NEEDLE = 7


class NeedleDataset(Dataset):
    """Random token sequences; the label says whether ``NEEDLE`` occurs in the sequence."""

    def __init__(self, size: int, seq_len: int, vocab_size: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.input_ids = torch.randint(NEEDLE + 1, vocab_size, (size, seq_len), generator=gen)
        self.labels = torch.randint(0, 2, (size,), generator=gen)
        where = torch.randint(0, seq_len, (size,), generator=gen)
        rows = self.labels.nonzero().squeeze(1)
        self.input_ids[rows, where[rows]] = NEEDLE

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids[i],
                "attention_mask": torch.ones_like(self.input_ids[i]), "labels": self.labels[i]}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Fine-tune a tiny transformer on synthetic data.")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=16, help="per process")
    parser.add_argument("--output_dir", default="tiny_bert")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def main() -> None:
    from transformers import BertConfig, BertForSequenceClassification  # the optional extra

    args = parse_args()
    accelerator = Accelerator()
    torch.manual_seed(args.seed)
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=2)
    model = BertForSequenceClassification(config)  # random init: nothing is downloaded
    train_dl = DataLoader(NeedleDataset(800, 16, config.vocab_size, seed=1),
                          batch_size=args.batch_size, shuffle=True)
    eval_dl = DataLoader(NeedleDataset(201, 16, config.vocab_size, seed=2),
                         batch_size=args.batch_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model, optimizer, train_dl, eval_dl = accelerator.prepare(model, optimizer, train_dl, eval_dl)

    for epoch in range(args.epochs):
        model.train()
        for batch in train_dl:
            outputs = model(**batch)  # a ModelOutput; .loss because labels are in the batch
            optimizer.zero_grad()
            accelerator.backward(outputs.loss)
            optimizer.step()
        accelerator.print(f"epoch {epoch}: loss {outputs.loss.item():.4f}")

    model.eval()
    correct = total = 0
    with torch.no_grad():
        for batch in eval_dl:
            logits = model(**batch).logits
            found = accelerator.gather_for_metrics(
                {"preds": logits.argmax(dim=-1), "labels": batch["labels"]})
            correct += (found["preds"] == found["labels"]).sum().item()
            total += found["labels"].numel()
    accelerator.print(f"accuracy {correct / total:.4f} on {total} sequences")

    accelerator.wait_for_everyone()
    accelerator.save_model(model, args.output_dir)  # model.safetensors, main process only
    if accelerator.is_main_process:
        accelerator.unwrap_model(model).config.save_pretrained(args.output_dir)
    accelerator.print(f"saved {args.output_dir} (BertForSequenceClassification.from_pretrained "
                      "reads it)")
    accelerator.end_training()


if __name__ == "__main__":
    main()
