"""Knobs exposed as flags under several spellings (``-b``, ``--batch-size``, ``--batch_size``,
``--batchSize``, ``--trainer.batch_size``), the DataLoader's worker count hard-coded (not exposed
at all). Prints what its DataLoader got, then its own throughput, with running totals of samples
trained on and seconds spent in the loop, and the monotonic clock's time of the line:

    loader batch_size=32 num_workers=0
    epoch 0 step 40 samples/s 702.3 train_samples 1280 train_s 1.823 at 5123.456

Runs ``--epochs`` epochs of ``--samples`` samples (0: until stopped).
"""

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

NUM_WORKERS = 0  # hard-coded, as in many scripts

parser = argparse.ArgumentParser()
parser.add_argument("-b", "--batch-size", "--batch_size", "--batchSize", "--trainer.batch_size",
                    dest="batch_size", type=int, default=32)
parser.add_argument("--epochs", type=int, default=0, help="0: until stopped")
parser.add_argument("--samples", type=int, default=4096)
parser.add_argument("--pace-ms", type=float, default=20.0, help="extra time per step (I/O)")
parser.add_argument("--log-s", type=float, default=0.5)
args = parser.parse_args()

torch.manual_seed(0)
data = TensorDataset(torch.randn(args.samples, 64), torch.randint(0, 10, (args.samples,)))
loader = DataLoader(data, batch_size=args.batch_size, num_workers=NUM_WORKERS, shuffle=True)
print(f"loader batch_size={loader.batch_size} num_workers={loader.num_workers}", flush=True)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

epoch, step, samples, logged = 0, 0, 0, 0
start = last = time.perf_counter()
while not args.epochs or epoch < args.epochs:
    for x, y in loader:
        time.sleep(args.pace_ms / 1000)
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        samples += len(x)
        now = time.perf_counter()
        if now - last >= args.log_s:
            print(f"epoch {epoch} step {step} samples/s {(samples - logged) / (now - last):.1f}"
                  f" train_samples {samples} train_s {now - start:.3f} at {time.monotonic():.3f}",
                  flush=True)
            last, logged = now, samples
    epoch += 1
print(f"done: {epoch} epochs, {step} steps")
