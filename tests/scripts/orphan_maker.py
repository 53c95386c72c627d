"""Leaves things behind: a setsid grandchild that ignores SIGTERM, and two loader workers."""

import subprocess
import sys

from _tiny import loader, parser, train

STUBBORN = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "time.sleep(3600)")

if __name__ == "__main__":
    args = parser().parse_args()
    child = subprocess.Popen([sys.executable, "-c", STUBBORN], start_new_session=True)
    print(f"grandchild {child.pid}", flush=True)
    args.workers = max(args.workers, 2)
    train(args, loader(args))
