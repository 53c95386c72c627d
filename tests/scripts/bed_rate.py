"""A bounded TCP transfer between two of the cluster bed's hosts, to measure a shaped link.

    bed_rate.py serve ADDR PORT NBYTES   listen, print "ready", receive NBYTES, print the rate
    bed_rate.py send ADDR PORT NBYTES    connect (retrying until a deadline), send NBYTES

The receiver times from its first byte to its last and prints {"bytes", "seconds",
"bits_per_s"}. Every socket operation has a timeout, so neither side waits forever.
"""

import json
import socket
import sys
import time

TIMEOUT_S = 30.0

mode, addr, port, nbytes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if mode == "serve":
    srv = socket.create_server((addr, port))
    srv.settimeout(TIMEOUT_S)
    print("ready", flush=True)
    conn, _ = srv.accept()
    conn.settimeout(TIMEOUT_S)
    got, first = 0, None
    while got < nbytes:
        chunk = conn.recv(1 << 16)
        if not chunk:
            break
        if first is None:
            first = time.monotonic()
        got += len(chunk)
    seconds = time.monotonic() - first
    conn.close()
    print(json.dumps({"bytes": got, "seconds": seconds, "bits_per_s": got * 8 / seconds}),
          flush=True)
else:
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            s = socket.create_connection((addr, port), timeout=TIMEOUT_S)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    block = b"x" * (1 << 16)
    left = nbytes
    while left > 0:
        s.sendall(block[:left])
        left -= len(block[:left])
    s.close()
