"""A PyTorch Lightning script as its users write it: a LightningModule, a DataModule-less
DataLoader, and a Trainer configured from the command line. With ``--devices 2 --strategy ddp``
Lightning starts the second rank itself (it runs this script again in a new process); under
torchrun it joins the job it finds.

    python fw_lightning.py --devices 2 --strategy ddp --batch-size 32 --workers 0

``--log-every N`` adds the throughput callback users write for themselves: rank zero prints
``lightning: batch N samples/s X`` (the whole job's, every rank's batch) every N batches.
"""

import argparse
import time

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


class Throughput(L.Callback):
    """Samples/s of the whole job, by the script's own clock, every ``every`` batches."""

    def __init__(self, every: int, batch_size: int):
        self.every, self.batch_size = every, batch_size
        self.t0 = None

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if not trainer.is_global_zero:
            return
        step = trainer.global_step
        if self.t0 is None:
            self.t0 = (time.perf_counter(), step)
        elif step - self.t0[1] >= self.every:
            now = time.perf_counter()
            rate = (step - self.t0[1]) * self.batch_size * trainer.world_size / (now - self.t0[0])
            print(f"lightning: batch {step} samples/s {rate:.1f}", flush=True)
            self.t0 = (now, step)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", default="1")
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--max-epochs", type=int, default=1000)
    parser.add_argument("--log-every", type=int, default=0)
    args = parser.parse_args()
    devices = int(args.devices) if args.devices.isdigit() else args.devices
    loader = DataLoader(Blobs(), batch_size=args.batch_size, shuffle=True,
                        num_workers=args.workers, persistent_workers=args.workers > 0)
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy=args.strategy,
                        max_epochs=args.max_epochs, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[Throughput(args.log_every, args.batch_size)]
                        if args.log_every else None)
    trainer.fit(Classifier(), loader)


if __name__ == "__main__":
    main()
