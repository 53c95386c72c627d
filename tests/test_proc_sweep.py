"""`autotune.hardware.proc.sweep`: what a launch leaves at its end is killed, including what a
victim forked while the sweep was killing it."""

import os
import sys
import uuid

from autotune.hardware import proc
from conftest import live_children, wait_for

# A rank that forks a child every millisecond, each child sleeping on: between the sweep's scan
# and its kill of the parent there is almost always a child the scan did not see.
FORKER = """
import os, time
while True:
    if os.fork() == 0:
        time.sleep(600)
        os._exit(0)
    time.sleep(0.001)
"""


def test_a_victim_forking_while_it_is_swept_leaves_nothing(tmp_path):
    marker = f"sweep-{uuid.uuid4().hex[:8]}"
    spec = proc.LaunchSpec(argv=(sys.executable, "-c", FORKER), env=dict(os.environ),
                           cwd=str(tmp_path), marker=marker,
                           stdout_path=tmp_path / "out.log", stderr_path=tmp_path / "err.log")
    launched = proc.start(spec)
    wait_for(lambda: len(proc.marked(marker)) > 50, timeout_s=30, what="forked children")
    killed = proc.sweep(launched)
    launched.popen.wait(timeout=10)
    assert len(killed) > 50
    # a child missed by one pass was killed by the next: none left, none adopted by us alive
    assert proc.marked(marker) == []
    assert live_children() == []
