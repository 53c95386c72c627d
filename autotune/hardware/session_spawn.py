"""Start several processes in one session of their own, apart from the controller's.

Run by `autotune.hardware.proc.start_together` as ``python -I -S session_spawn.py``, in a new
session: it reads one JSON line on stdin (a list of ``{"argv", "env", "cwd", "out", "err"}``,
``out`` and ``err`` being file descriptors it was handed), starts each process in a process
group of its own (so each can be signalled whole), prints one JSON line with their pids (or
``{"error": ...}``), and exits once its stdin closes. The controller registers the pids before
it closes that stdin; then, this process gone, the kernel hands them to the controller, which
is a subreaper.

Why a session of their own: Linux's autogroup scheduling (``sched_autogroup_enabled``) treats
each session as one group, and ranks started one session each compete with one another as
strangers, where torchrun's ranks share their agent's session. Standard library only: it runs
isolated from the user's site packages.
"""

import json
import os
import subprocess
import sys


def main() -> int:
    try:
        todo = json.loads(sys.stdin.readline())
    except ValueError as exc:
        print(json.dumps({"error": f"bad request: {exc}"}), flush=True)
        return 2
    pids: list[int] = []
    for item in todo:
        out, err = item["out"], item["err"]
        try:
            child = subprocess.Popen(
                item["argv"], cwd=item["cwd"], env=item["env"], stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT if err is None else err, close_fds=True,
                preexec_fn=os.setpgrp)  # one thread here: preexec_fn is safe
        except OSError as exc:
            for pid in pids:  # nothing half-started is left behind
                try:
                    os.killpg(pid, 9)
                    os.waitpid(pid, 0)
                except OSError:
                    pass
            print(json.dumps({"error": exc.strerror or str(exc), "argv0": item["argv"][0]}),
                  flush=True)
            return 1
        pids.append(child.pid)
    print(json.dumps({"pids": pids}), flush=True)
    sys.stdin.read()  # until the controller has registered them and closes it
    return 0


if __name__ == "__main__":
    sys.exit(main())
