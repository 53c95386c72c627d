"""Reports its own throughput, and was not built around any meter.

Every half second of wall time it prints `throughput: X samples/s at T`, counting the samples it trained
on since the last line; T is time.monotonic() at the end of that span.
"""

import time

import torch
from torch import nn

from _tiny import loader, model, parser

if __name__ == "__main__":
    args = parser().parse_args()
    dl = loader(args)
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    n, t0 = 0, time.monotonic()
    while True:
        for x, y in dl:
            loss = nn.functional.cross_entropy(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            n += len(x)
            now = time.monotonic()
            if now - t0 >= 0.5:
                print(f"throughput: {n / (now - t0):.1f} samples/s at {now:.3f}", flush=True)
                n, t0 = 0, now
