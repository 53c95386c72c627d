"""A DataLoader worker is killed mid-run (SIGKILL), as the OOM killer does to a fat worker.

torch then raises "DataLoader worker (pid N) is killed by signal: Killed." in the main process.
"""

import os
import signal

import torch
from torch.utils.data import Dataset

from _tiny import data, loader, parser, train


class Dying(Dataset):
    def __init__(self, after):
        self.inner = data()
        self.after = after
        self.served = 0

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        if torch.utils.data.get_worker_info() is not None:
            self.served += 1
            if self.served > self.after:
                os.kill(os.getpid(), signal.SIGKILL)
        return self.inner[i]


if __name__ == "__main__":
    args = parser(after=200).parse_args()
    args.workers = max(args.workers, 2)
    train(args, loader(args, Dying(args.after)))
