"""A launch's process tree, read from the kernel's per-thread children lists (`proc.descendants`):
the same processes psutil finds by reading every process on the host, children started from any
thread included, and psutil's walk where the kernel keeps no such lists."""

import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from autotune.hardware import proc

# a parent that starts one child from its main thread and one from another thread; the first
# child starts a grandchild; each prints its pid and sleeps until killed
FAMILY = textwrap.dedent("""
    import subprocess, sys, threading, time
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    if sys.argv[1] == "parent":
        subprocess.Popen([sys.executable, __file__, "child"])
        # the thread lives on: while it does, the kernel lists its child under it alone
        threading.Thread(target=lambda: (subprocess.Popen(sleeper), time.sleep(60)),
                         daemon=True).start()
    else:
        subprocess.Popen(sleeper)
    time.sleep(60)
""")


@pytest.fixture
def family(tmp_path):
    script = tmp_path / "family.py"
    script.write_text(FAMILY)
    p = subprocess.Popen([sys.executable, str(script), "parent"], start_new_session=True)
    root = psutil.Process(p.pid)
    deadline = time.monotonic() + 30
    while len(root.children(recursive=True)) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        yield root
    finally:
        for q in [root, *root.children(recursive=True)]:
            try:
                q.kill()
            except psutil.Error:
                pass
        p.wait(10)


def test_the_kernel_s_lists_find_what_psutil_finds_children_of_any_thread_included(family):
    expected = sorted(q.pid for q in family.children(recursive=True))
    assert len(expected) == 3, expected  # the child, its grandchild, the other thread's child
    assert sorted(q.pid for q in proc.descendants(family)) == expected


def test_without_the_kernel_s_lists_psutil_walks_the_host(family, monkeypatch):
    monkeypatch.setattr(proc, "_children_files", lambda pid: None)
    assert sorted(q.pid for q in proc.descendants(family)) == \
        sorted(q.pid for q in family.children(recursive=True))


def test_a_process_without_children_has_none(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert proc.descendants(psutil.Process(p.pid)) == []
    finally:
        p.kill()
        p.wait(10)
