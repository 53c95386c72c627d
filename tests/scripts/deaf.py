"""A training script that takes Ctrl-C (SIGINT) for a note and trains on, as one whose own
handler waits on something that never comes would: only SIGTERM or SIGKILL ends it."""

import signal

from _tiny import loader, parser, train

if __name__ == "__main__":
    args = parser().parse_args()
    signal.signal(signal.SIGINT, lambda signum, frame: print("SIGINT: training on", flush=True))
    train(args, loader(args))
