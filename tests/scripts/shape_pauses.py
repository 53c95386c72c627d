"""Training with one-off work inside the run, as real scripts have it: text sampling right after
step 0, evaluation every few seconds of training, checkpoints written every few steps to a path
relative to the working directory. Runs until stopped (or ``--steps``).

It keeps its own clock of training time (the loop, with the batch fetch, minus sampling,
evaluation and checkpoints) and prints it with its running sample count and the wall time:

    step 40 loss 2.2931 samples/s 702.3 train_samples 640 train_s 0.912 wall_s 5.431
"""

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--sample-s", type=float, default=5.0, help="text sampling after step 0")
parser.add_argument("--eval-every-s", type=float, default=2.0, help="of training time")
parser.add_argument("--eval-s", type=float, default=0.6)
parser.add_argument("--ckpt-every", type=int, default=25, help="steps; 0: never")
parser.add_argument("--ckpt", default="ckpt.pt")
parser.add_argument("--steps", type=int, default=0, help="0: until stopped")
parser.add_argument("--pace-ms", type=float, default=20.0, help="extra time per step (I/O)")
parser.add_argument("--log-s", type=float, default=0.5)
args = parser.parse_args()

torch.manual_seed(0)
D, C = 64, 10
train = TensorDataset(torch.randn(4096, D), torch.randint(0, C, (4096,)))
val = TensorDataset(torch.randn(512, D), torch.randint(0, C, (512,)))
loader = DataLoader(train, batch_size=args.batch_size, shuffle=True)
val_loader = DataLoader(val, batch_size=64)
model = nn.Sequential(nn.Linear(D, 128), nn.ReLU(), nn.Linear(128, C))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

clock = {"train_s": 0.0, "since": time.perf_counter()}
wall_start = clock["since"]


def training_s() -> float:
    return clock["train_s"] + time.perf_counter() - clock["since"]


def off_the_clock(work, *a):
    clock["train_s"] = training_s()
    work(*a)
    clock["since"] = time.perf_counter()


def busy_for(seconds, body):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        body()


def sample_text():
    with torch.no_grad():
        tokens = []
        x = torch.randn(1, D)

        def next_token():
            tokens.append(int(model(x).argmax()))

        busy_for(args.sample_s, next_token)
    print(f"sample: {' '.join(map(str, tokens[:12]))} ... ({len(tokens)} tokens)")


def evaluate():
    model.eval()
    losses = []
    with torch.no_grad():
        def one_pass():
            for x, y in val_loader:
                losses.append(nn.functional.cross_entropy(model(x), y).item())

        busy_for(args.eval_s, one_pass)
    model.train()
    print(f"eval loss {sum(losses) / len(losses):.4f} over {len(losses)} batches")


step, samples, last_eval, last_log, log_samples = 0, 0, 0.0, 0.0, 0
while not args.steps or step < args.steps:
    for x, y in loader:
        time.sleep(args.pace_ms / 1000)
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        samples += len(x)
        log_samples += len(x)
        if step == 1 and args.sample_s:
            off_the_clock(sample_text)
        if args.ckpt_every and step % args.ckpt_every == 0:
            off_the_clock(torch.save, model.state_dict(), args.ckpt)
        now = training_s()
        if now - last_log >= args.log_s:
            rate = log_samples / (now - last_log)
            print(f"step {step} loss {loss.item():.4f} samples/s {rate:.1f}"
                  f" train_samples {samples} train_s {now:.3f}"
                  f" wall_s {time.perf_counter() - wall_start:.3f}")
            last_log, log_samples = now, 0
        if args.eval_every_s and now - last_eval >= args.eval_every_s:
            off_the_clock(evaluate)
            last_eval = training_s()
        if args.steps and step >= args.steps:
            break
print(f"done: {step} steps")
