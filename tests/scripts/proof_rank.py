"""A rank for the GPU proof kit on the fake GPU host: the bundled CUDA example's interface, no CUDA.

Connects to MPS the way the CUDA driver does (`fake_cuda.connect`, which stays silent when there
is no daemon, as the driver does), joins a gloo group when ``WORLD_SIZE > 1``, trains a tiny
model on a DataLoader for ``--seconds`` (every rank stops at the same step), and prints the
example's last line, which the kit reads::

    done: N steps, mean samples/s X, steady samples/s Y (after W warm-up steps) on cpu
"""

import argparse
import gc
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fakes"))

import fake_cuda  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

WARMUP_STEPS = 5


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--backend", default="auto")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--epochs", type=int, default=1)  # taken, as the example does; unused
    p.add_argument("--step-s", type=float, default=0.005)
    args = p.parse_args()
    client = fake_cuda.connect()  # kept open: the client stays registered while it is
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo" if args.backend == "auto" else args.backend)
    rank = dist.get_rank() if world > 1 else 0
    data = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
    model = nn.Linear(8, 2)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step, steady_samples, t_start, t_steady, done = 0, 0, time.perf_counter(), None, False
    while not done:
        for x, y in DataLoader(data, batch_size=args.batch_size, num_workers=args.workers):
            time.sleep(args.step_s)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            step += 1
            if step == WARMUP_STEPS:
                t_steady = time.perf_counter()
            elif t_steady is not None:
                steady_samples += x.shape[0] * world
            up = torch.tensor([float(time.perf_counter() - t_start >= args.seconds)])
            if world > 1:
                dist.all_reduce(up, op=dist.ReduceOp.MAX)
            if up.item():
                done = True
                break
    t_end = time.perf_counter()
    if rank == 0:
        steady = f"{steady_samples / (t_end - t_steady):.1f}" if steady_samples else "n/a"
        mean = step * args.batch_size * world / (t_end - t_start)
        print(f"done: {step} steps, mean samples/s {mean:.1f}, "
              f"steady samples/s {steady} (after {WARMUP_STEPS} warm-up steps) on cpu "
              f"(mps client: {client is not None})", flush=True)
    if world > 1:
        del model, opt  # DDP's cycles would keep the group until shutdown, where gloo's
        gc.collect()  # teardown can abort a rank ("terminate called without an active
        dist.barrier()  # exception", seen once in CI); both leave together
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
