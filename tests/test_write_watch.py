"""The probes' write watch (`probes.writes`): which calls write which paths, and, in a process
of its own (the wrappers replace ``open`` and ``os`` functions there), what a script's writes
into the user's tree report."""

import json
import os

from probes import writes
from test_shapes_probes import run_py


def test_reportable_paths():
    watch = ["/home/u/proj"]
    assert writes.reportable("/home/u/proj/ckpt.pt", watch, None)
    assert writes.reportable("/home/u/proj", watch, None)
    assert not writes.reportable("/home/u/project2/x", watch, None)
    assert not writes.reportable("/tmp/x", watch, None)
    assert not writes.reportable("/home/u/proj/pkg/__pycache__/m.cpython-311.pyc", watch, None)
    assert not writes.reportable("/home/u/proj/probe/ckpt.pt", watch, "/home/u/proj/probe")


def test_the_paths_each_wrapped_call_writes():
    assert writes.opened(("a",), {}) == [] and writes.opened(("a", "rb"), {}) == []
    assert writes.opened(("a", "w"), {}) == [("a", "write")]
    assert writes.opened(("a",), {"mode": "r+b"}) == [("a", "write")]
    assert writes.opened((), {"file": "a", "mode": "x"}) == [("a", "write")]
    assert writes.opened((3, "w"), {}) == []  # a descriptor, no path
    assert writes.os_opened(("a", os.O_RDONLY), {}) == []
    assert writes.os_opened(("a", os.O_WRONLY | os.O_CREAT), {}) == [("a", "write")]
    assert writes.os_opened(("a", os.O_RDWR), {"dir_fd": 5}) == []  # relative to a directory
    assert writes.removed(("a",), {}) == [("a", "delete")]
    assert writes.removed(("a",), {"dir_fd": 5}) == []
    assert writes.removed(("/abs/a",), {"dir_fd": 5}) == [("/abs/a", "delete")]
    assert writes.renamed(("a", "b"), {}) == [("a", "rename"), ("b", "rename")]
    assert writes.renamed(("a", "b"), {"src_dir_fd": 5}) == [("b", "rename")]
    assert writes.truncated(("a", 0), {}) == [("a", "truncate")]
    assert writes.truncated((4, 0), {}) == []


def test_write_watch_in_a_process(tmp_path):
    tree, scratch, elsewhere = tmp_path / "tree", tmp_path / "tree" / "probe", tmp_path / "else"
    for d in (tree, scratch, elsewhere):
        d.mkdir(parents=True, exist_ok=True)
    (tree / "old.txt").write_text("precious")
    (tree / "data.txt").write_text("input")
    code = f"""
        import json, logging, os, pathlib, shutil, sys, torch
        from probes import protocol, writes
        sys.addaudithook = None                        # the watch installs no audit hook

        class Meter:
            def send(self, kind, **fields):
                print(json.dumps(fields["paths"][0]))

        os.environ[protocol.ENV_WATCH_DIRS] = {str(tree)!r}
        os.environ[protocol.ENV_SCRATCH_DIR] = {str(scratch)!r}
        writes.watch(Meter())
        os.chdir({str(tree)!r})
        open("data.txt").read()                       # a read: nothing
        open("old.txt", "w").write("overwritten")     # relative, existed
        open("old.txt", "a").write("again")           # the same path again: once
        torch.save({{"w": 1}}, "ckpt.pt")             # written from C++
        os.makedirs("__pycache__", exist_ok=True)
        open("__pycache__/x.pyc", "wb").close()       # Python's cache: not the user's
        open({str(scratch / 'probe.txt')!r}, "w").close()     # the probe's own directory
        open({str(elsewhere / 'out.txt')!r}, "w").close()     # outside the tree
        os.remove("data.txt")
        pathlib.Path("notes.txt").write_text("x")     # pathlib: io.open
        pathlib.Path("touched").touch()               # pathlib: os.open
        os.replace("notes.txt", "moved.txt")          # both paths (notes.txt told already)
        os.makedirs("runs/a", exist_ok=True)
        open("runs/a/events", "w").close()
        shutil.rmtree("runs")                          # its top directory, once
        log = logging.FileHandler("train.log")         # logging opens through open()
        log.close()
        x = object()
        ids = sum(id(x) > 0 for _ in range(1000))      # no audit hook hears these
        print(json.dumps({{"ids": ids}}))
    """
    done = run_py(code)
    assert done.returncode == 0, done.stderr
    seen = [json.loads(line) for line in done.stdout.splitlines()]
    assert seen[-1] == {"ids": 1000}
    assert [(w["path"], w["op"], w["existed"]) for w in seen[:-1]] == [
        (str(tree / "old.txt"), "write", True),
        (str(tree / "ckpt.pt"), "write", False),
        (str(tree / "data.txt"), "delete", True),
        (str(tree / "notes.txt"), "write", False),
        (str(tree / "touched"), "write", False),
        (str(tree / "moved.txt"), "rename", False),
        (str(tree / "runs" / "a" / "events"), "write", False),
        (str(tree / "runs"), "delete", True),
        (str(tree / "train.log"), "write", False),
    ]


def test_write_watch_notes_another_thread_s_file_while_it_notes_one(tmp_path):
    """The guard that keeps the watch from noting its own calls is the noting thread's: a
    checkpoint thread's file, opened while the training thread's path is being sent, is
    noted too."""
    tree = tmp_path / "tree"
    tree.mkdir()
    code = f"""
        import json, os, sys, threading
        from probes import protocol, writes

        sending, other_done = threading.Event(), threading.Event()

        class Meter:
            def send(self, kind, **fields):
                print(json.dumps(fields["paths"][0]["path"]), flush=True)
                if not sending.is_set():
                    sending.set()  # the first path is being sent: another thread writes now
                    other_done.wait(10)

        os.environ[protocol.ENV_WATCH_DIRS] = {str(tree)!r}
        writes.watch(Meter())
        os.chdir({str(tree)!r})

        def checkpoint():
            sending.wait(10)
            open("ckpt.pt", "w").close()
            other_done.set()

        threading.Thread(target=checkpoint).start()
        open("log.txt", "w").close()
    """
    done = run_py(code)
    assert done.returncode == 0, done.stderr
    assert sorted(json.loads(line) for line in done.stdout.splitlines()) == \
        [str(tree / "ckpt.pt"), str(tree / "log.txt")]
