"""Trains, then blocks forever without using the CPU, like a deadlocked collective."""

import sys
import threading

from _tiny import loader, parser, train


def block(step):
    if step >= args.after:
        threading.Event().wait()


if __name__ == "__main__":
    p = parser()
    p.add_argument("--at-start", action="store_true", help="hang before the first batch")
    args = p.parse_args()
    if args.at_start:
        threading.Event().wait()
    train(args, loader(args), on_step=block)
    sys.exit(0)
