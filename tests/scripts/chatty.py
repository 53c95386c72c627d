"""Trains like ok.py and prints fast: about 64 KiB of log per step (megabytes a second).
``--burst-mb N``: print N MiB before the first step (a big log whatever the machine's speed);
``--die-at K``: at step K, print a last line and exit 3."""

import sys

from _tiny import loader, parser, train

LINE = "chatter " + "x" * 8184


def talk(step):
    for i in range(8):
        print(f"{step}.{i} {LINE}", flush=True)
    if args.die_at and step >= args.die_at:
        print("chatty: my last words", flush=True)
        sys.exit(3)


if __name__ == "__main__":
    p = parser()
    p.add_argument("--die-at", type=int, default=0)
    p.add_argument("--burst-mb", type=int, default=0)
    args = p.parse_args()
    for i in range(args.burst_mb * 128):
        print(f"burst {i} {LINE}")
    sys.stdout.flush()
    train(args, loader(args), on_step=talk)
