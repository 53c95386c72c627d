"""A streamed launch (the full run's ranks): its processes write their output to their log
themselves, and each line reaches ``on_output`` too, read back from the log
(`autotune.hardware.proc._follow`), in order, with nothing lost at the end."""

import os
import sys
import textwrap
import threading
import uuid

from autotune.hardware import proc

# prints a few lines, some from a child that outlives it, and a last line without a newline
TALKER = textwrap.dedent("""
    import subprocess, sys, time
    for i in range(5):
        print(f"line {i}", flush=True)
        time.sleep(0.1)
    print("to stderr", file=sys.stderr, flush=True)
    subprocess.Popen([sys.executable, "-c", "print('from the child', flush=True)"]).wait()
    sys.stdout.write("no newline")
    sys.stdout.flush()
""")


def streamed(tmp_path, code: str, *, before: bytes = b"") -> tuple[list[str], bytes, int]:
    log = tmp_path / "rank0.log"
    log.write_bytes(before)
    got: list[str] = []
    lock = threading.Lock()

    def on_output(line: str) -> None:
        with lock:
            got.append(line)

    launched = proc.start(proc.LaunchSpec(
        argv=(sys.executable, "-c", code), env=dict(os.environ), cwd=str(tmp_path),
        marker=f"stream-{uuid.uuid4().hex[:8]}", stdout_path=log, stderr_path=log, stream_output=True),
        on_output=on_output)
    launched.popen.wait(timeout=60)
    code = proc.stop(launched, grace_s=1.0)
    return got, log.read_bytes(), code


def test_every_line_reaches_the_log_and_on_output_in_order(tmp_path):
    got, log, code = streamed(tmp_path, TALKER)
    assert code == 0
    want = [*(f"line {i}\n" for i in range(5)), "to stderr\n", "from the child\n", "no newline"]
    assert got == want
    assert log.decode() == "".join(want)


def test_what_the_log_held_before_the_launch_is_not_passed_on(tmp_path):
    """`autotune run --again` appends to the run's log: the earlier run's lines stay there and
    are not streamed a second time."""
    got, log, _ = streamed(tmp_path, "print('again', flush=True)", before=b"earlier run\n")
    assert got == ["again\n"]
    assert log == b"earlier run\nagain\n"


def test_the_follower_ends_with_the_launch(tmp_path):
    _, _, code = streamed(tmp_path, "import sys; sys.exit(3)")
    assert code == 3
    assert not [t for t in threading.enumerate() if t.name.startswith("autotune-follow-")]
