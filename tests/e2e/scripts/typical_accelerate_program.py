"""The program Hugging Face Accelerate users typically write; only the import line differs.

Run: python typical_accelerate_program.py OUTPUT_DIR
"""

import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator, notebook_launcher  # was: from accelerate import ...


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 4 * 4, 2)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return self.fc(x.flatten(1))


def make_data(n):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 1, 8, 8, generator=g)
    y = (x[:, 0, :4].mean(dim=(1, 2)) > 0).long()
    return TensorDataset(x, y)


def training_function(output_dir):
    accelerator = Accelerator()
    torch.manual_seed(0)
    model = SmallCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    train_dl = DataLoader(make_data(96), batch_size=8, shuffle=True)
    eval_dl = DataLoader(make_data(37), batch_size=8)
    model, optimizer, train_dl, eval_dl = accelerator.prepare(model, optimizer, train_dl, eval_dl)
    for epoch in range(3):
        model.train()
        for x, y in train_dl:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
    model.eval()
    correct, total = 0, 0
    for x, y in eval_dl:
        with torch.no_grad():
            preds = model(x).argmax(dim=-1)
        preds, labels = accelerator.gather_for_metrics((preds, y))
        correct += (preds == labels).sum().item()
        total += labels.numel()
    accelerator.wait_for_everyone()
    accelerator.print(f"evaluated {total} samples, accuracy {correct / total:.3f}")
    unwrapped = accelerator.unwrap_model(model)
    accelerator.save(unwrapped.state_dict(), f"{output_dir}/model.pth")
    return {"rank": accelerator.process_index, "total": total,
            "world": accelerator.num_processes}


if __name__ == "__main__":
    result = notebook_launcher(training_function, (sys.argv[1],), num_processes=2)
    print("RESULT", result)
