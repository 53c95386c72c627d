"""Stand-in for the CUDA driver's side of MPS: connect this process to the (fake) MPS daemon.

The real driver, at CUDA initialisation, connects to the control daemon found through
``CUDA_MPS_PIPE_DIRECTORY`` and silently runs without MPS when it cannot. `connect` does the same
against ``tests/fakes/bin/nvidia-cuda-mps-control`` and returns the open socket (keep it: the
client stays registered while it is open) or None. Standard library only.
"""

import json
import os
import socket


def connect():
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(os.path.join(pipe, "control"))
        hello = {"op": "client", "pid": os.getpid(), "uid": os.getuid(),
                 "pct": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
                 "devices": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
        sock.sendall((json.dumps(hello) + "\n").encode())
        reply = sock.makefile("rb").readline()
        if not reply:
            sock.close()
            return None
    except OSError:
        sock.close()
        return None
    return sock
