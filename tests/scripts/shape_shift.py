"""A script whose step time moves by itself mid-run, as nanoGPT's did on the CPU (~49 ms to
~37 ms half a minute in): steps of ``--slow-ms`` for the first ``--shift-s`` seconds of
training, then of ``--fast-ms``; with ``--ramp-s R`` the step time instead grows steadily from
``--fast-ms`` to ``--slow-ms`` over R seconds (a machine that throttles as it heats). The work
per step is a sleep on top of a tiny model, so the move is the script's own, whatever else
runs on the machine."""

import time

import torch
from torch import nn

from _tiny import loader, model, parser

if __name__ == "__main__":
    p = parser()
    p.add_argument("--shift-s", type=float, default=7.0)
    p.add_argument("--slow-ms", type=float, default=40.0)
    p.add_argument("--fast-ms", type=float, default=10.0)
    p.add_argument("--ramp-s", type=float, default=0.0)
    args = p.parse_args()
    net, t0 = model(), None
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    while True:
        for x, y in loader(args):
            t0 = t0 or time.monotonic()
            loss = nn.functional.cross_entropy(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            t = time.monotonic() - t0
            if args.ramp_s:
                ms = args.fast_ms + (args.slow_ms - args.fast_ms) * min(1.0, t / args.ramp_s)
            else:
                ms = args.fast_ms if t >= args.shift_s else args.slow_ms
            time.sleep(ms / 1000)
