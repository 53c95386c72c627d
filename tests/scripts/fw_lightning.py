"""A PyTorch Lightning script as its users write it: a LightningModule, a DataModule-less
DataLoader, and a Trainer configured from the command line. With ``--devices 2 --strategy ddp``
Lightning starts the second rank itself (it runs this script again in a new process); under
torchrun it joins the job it finds.

    python fw_lightning.py --devices 2 --strategy ddp --batch-size 32 --workers 0
"""

import argparse

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Blobs(Dataset):
    def __init__(self, n=8192, dim=32):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, dim, generator=g)
        self.y = (self.x.sum(dim=1) > 0).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Classifier(L.LightningModule):
    def __init__(self, dim=32, hidden=256, lr=1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                 nn.ReLU(), nn.Linear(hidden, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", default="1")
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--max-epochs", type=int, default=1000)
    args = parser.parse_args()
    devices = int(args.devices) if args.devices.isdigit() else args.devices
    loader = DataLoader(Blobs(), batch_size=args.batch_size, shuffle=True,
                        num_workers=args.workers, persistent_workers=args.workers > 0)
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy=args.strategy,
                        max_epochs=args.max_epochs, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Classifier(), loader)


if __name__ == "__main__":
    main()
