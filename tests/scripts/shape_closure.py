"""Steps that run their forward and backward inside ``optimizer.step(closure)``: ``LBFGS``
(several evaluations of the closure a step) or SGD handed a closure, as Lightning's automatic
optimization does. A plain loop in every other respect: a DataLoader, a log line now and then."""

import time

import torch
from torch import nn

from _tiny import data, loader, model, parser

if __name__ == "__main__":
    p = parser()
    p.add_argument("--optimizer", choices=("lbfgs", "sgd"), default="lbfgs")
    args = p.parse_args()
    net = model()
    if args.optimizer == "lbfgs":
        opt = torch.optim.LBFGS(net.parameters(), lr=0.1, max_iter=3, history_size=5)
    else:
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
    step, t0 = 0, time.perf_counter()
    while step < args.steps:
        for x, y in loader(args, data()):
            def closure(x=x, y=y):
                opt.zero_grad()
                loss = nn.functional.cross_entropy(net(x), y)
                loss.backward()
                return loss

            opt.step(closure)
            step += 1
            if step % args.log_interval == 0:
                print(f"step {step} samples/s {args.log_interval * len(x) / (time.perf_counter() - t0):.1f}", flush=True)
                t0 = time.perf_counter()
            if step >= args.steps:
                break
