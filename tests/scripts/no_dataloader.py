"""No DataLoader: batches sliced from an in-memory tensor, trained with an optimizer."""

import time

import torch
from torch import nn

from _tiny import data, model, parser

if __name__ == "__main__":
    args = parser().parse_args()
    x_all, y_all = data().tensors
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    step, t0 = 0, time.perf_counter()
    while step < args.steps:
        for i in range(0, len(x_all) - args.batch_size + 1, args.batch_size):
            x, y = x_all[i:i + args.batch_size], y_all[i:i + args.batch_size]
            loss = nn.functional.cross_entropy(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step % args.log_interval == 0:
                now = time.perf_counter()
                print(f"step {step} samples/s {args.log_interval * args.batch_size / (now - t0):.1f}",
                      flush=True)
                t0 = now
            if step >= args.steps:
                break
