"""Runs out of host memory the way a too-large batch does on CPU.

torch raises: RuntimeError: [enforce fail at alloc_cpu.cpp:...] . DefaultCPUAllocator: can't
allocate memory: you tried to allocate 70368744177664 bytes. Error code 12 (Cannot allocate memory)
"""

import torch

from _tiny import loader, parser, train


def blow_up(step):
    if step >= args.after:
        torch.empty(2**44, dtype=torch.float32)


if __name__ == "__main__":
    args = parser(after=20).parse_args()
    train(args, loader(args), on_step=blow_up)
