"""`watch` and `Monitor`: plain lines, the live view, falling back, sampling, never failing the run."""

import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from rich.console import Console
from rich.table import Table

from autotune.store.journal import Journal, read_events
from autotune.monitor import Monitor, use_plain, watch
from autotune.monitor import view
from autotune.monitor.sampler import GpuSource, run_processes
from conftest import wait_for

FAKES = Path(__file__).parent / "fakes"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


def device_samples(run_dir):
    return [e for e in read_events(run_dir)[0] if e["event"] == "device_sample"]


def emit_small_run(journal: Journal) -> None:
    journal.emit("run_started", kind="tune", command=["train.py"], cwd=".", budget_s=60,
                 trials=3)
    journal.emit("trial_started", trial="trial-0", number=0, knobs={"batch_size": 32},
                 mode="full")
    journal.emit("trial_finished", trial="trial-0", number=0, mode="full",
                 result={"outcome": "oom", "reason": "out of memory: CUDA",
                         "knobs": {"batch_size": 32}, "duration_s": 3.0})
    journal.emit("run_ended", exit_code=0)


def test_watch_on_a_pipe_prints_one_plain_line_per_event(tmp_path):
    out = io.StringIO()
    journal = Journal(tmp_path)
    with watch(tmp_path, title="autotune tune · train.py", stream=out):
        emit_small_run(journal)
    text = out.getvalue()
    assert not ANSI.search(text)
    lines = text.splitlines()
    assert lines[0] == "autotune: autotune tune · train.py"
    assert [ln.split(" ", 1)[1] for ln in lines[1:]] == [
        "run started: autotune tune train.py (budget 1:00, up to 3 trials)",
        "trial #0 started: batch_size=32 (mode full)",
        "trial #0 oom: out of memory: CUDA · batch_size=32 · 0:03",
        "run ended: exit code 0"]


def test_no_color_or_plain_flag_means_plain_even_on_a_terminal(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert use_plain(FakeTTY(), False) is False
    assert use_plain(FakeTTY(), True) is True
    assert use_plain(io.StringIO(), False) is True
    monkeypatch.setenv("NO_COLOR", "1")
    assert use_plain(FakeTTY(), False) is True


def test_live_view_draws_the_run_and_leaves_the_final_frame(tmp_path):
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=110, height=60)
    emit_small_run(Journal(tmp_path))
    m = Monitor(tmp_path, console=console, stream=io.StringIO())
    m.start_live()
    m.loop(until_ended=True)
    m.close()
    text = ANSI.sub("", screen.getvalue())
    assert m.failed is None and not m.plain
    assert "autotune tune · train.py" in text
    assert "oom: out of memory: CUDA" in text
    assert "finished" in text


def test_a_failing_live_view_falls_back_to_plain_lines(tmp_path, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("terminal went away")

    monkeypatch.setattr(view, "render", broken)
    log = io.StringIO()
    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    journal = Journal(tmp_path)
    journal.emit("run_started", kind="tune", command=["train.py"], cwd=".")
    m = Monitor(tmp_path, console=console, stream=log)
    m.start_live()
    m.step()
    assert m.plain and m.failed == "RuntimeError: terminal went away"
    journal.emit("run_ended", exit_code=3)
    m.step()
    m.close()
    lines = log.getvalue().splitlines()
    assert lines[0] == ("WARNING: live monitor failed (RuntimeError: terminal went away); "
                        "plain lines from here")
    assert lines[1].endswith("run ended: exit code 3")


def test_watch_never_fails_the_run(tmp_path):
    missing = tmp_path / "not-there"  # no journal can be written or read here
    with watch(missing, stream=io.StringIO(), sample_interval_s=0.05) as watching:
        time.sleep(0.2)
        result = "the run's own result"
    assert result == "the run's own result" and watching.monitor is not None


def test_errors_of_the_run_pass_through_and_threads_stop(tmp_path):
    with pytest.raises(KeyError, match="the run's own error"):
        with watch(tmp_path, stream=io.StringIO(), sample_interval_s=0.05):
            raise KeyError("the run's own error")
    names = {t.name for t in threading.enumerate()}
    assert "autotune-monitor" not in names and "autotune-sampler" not in names


def test_run_ended_stays_last_when_a_device_sample_was_being_read(tmp_path, monkeypatch):
    """A command ends (here by SIGTERM's KeyboardInterrupt) while the sampler is inside a slow
    reading: the reading is dropped, and ``run_ended`` is the journal's last event."""
    from autotune.commands.tune import ending
    from autotune.monitor import sampler as sampler_module

    reading, release = threading.Event(), threading.Event()

    def slow_sample(gpu=None, root_pid=None):
        reading.set()
        release.wait(timeout=60)
        return {"cpu_pct": [], "mem_used_bytes": None, "mem_total_bytes": None, "gpus": [],
                "workers": None, "ranks": None}

    monkeypatch.setattr(sampler_module, "sample", slow_sample)
    journal = Journal(tmp_path)
    journal.emit("run_started", kind="run", command=["train.py"], cwd=".")
    with pytest.raises(KeyboardInterrupt):
        with watch(tmp_path, stream=io.StringIO(), sample_interval_s=0.01) as watching, \
                ending(journal, quiet=watching.quiet):
            assert reading.wait(timeout=30)
            raise KeyboardInterrupt
    threads = [t for t in threading.enumerate() if t.name == "autotune-sampler"]
    release.set()  # the reading ends after run_ended was written
    for t in threads:
        t.join(timeout=30)
    events, _ = read_events(tmp_path)
    assert [e["event"] for e in events][-1] == "run_ended", events[-2:]
    assert events[-1]["exit_code"] == 130


def test_sampler_writes_device_samples_into_the_journal(tmp_path):
    with watch(tmp_path, stream=io.StringIO(), sample_interval_s=0.1):
        samples = wait_for(lambda: device_samples(tmp_path), what="a device_sample")
    s = samples[0]
    assert len(s["cpu_pct"]) == psutil.cpu_count()
    assert all(0.0 <= c <= 100.0 for c in s["cpu_pct"])
    assert 0 < s["mem_used_bytes"] < s["mem_total_bytes"] == psutil.virtual_memory().total
    assert s["gpus"] == [] and s["workers"] == 0 and s["ranks"] == 0


RANK = r"""
import multiprocessing as mp, sys, time
def worker():
    time.sleep(60)
if __name__ == "__main__":
    ps = [mp.get_context("fork").Process(target=worker, daemon=True) for _ in range(2)]
    for p in ps:
        p.start()
    print("ready", flush=True)
    time.sleep(60)
"""


@pytest.fixture
def fake_rank(tmp_path):
    """A process that looks like a rank (``probes.boot`` in argv, RANK=3) with 2 loader workers."""
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    proc = subprocess.Popen([sys.executable, str(script), "probes.boot"], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "RANK": "3"})
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        proc.wait()


def test_ranks_and_loader_workers_of_the_run_are_counted(fake_rank, tmp_path):
    ranks, workers, pids = run_processes()
    assert (ranks, workers, pids) == (1, 2, [fake_rank.pid])
    with watch(tmp_path, stream=io.StringIO(), sample_interval_s=0.1):
        s = wait_for(lambda: device_samples(tmp_path), what="a device_sample")[0]
    assert (s["ranks"], s["workers"]) == (1, 2)


def _fake_pynvml(monkeypatch, tmp_path, devices):
    spec = importlib.util.spec_from_file_location("pynvml", FAKES / "pynvml.py")
    fake = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake)
    config = tmp_path / "nvml.json"
    config.write_text(json.dumps({"driver": "loaded", "driver_version": "550.54.15",
                                  "devices": devices}))
    monkeypatch.setenv("FAKE_PYNVML_CONFIG", str(config))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    nvml = pytest.importorskip("autotune.hardware.nvml")
    nvml.shutdown()
    return nvml


def test_gpus_through_nvml_with_the_ranks_on_each(fake_rank, tmp_path, monkeypatch):
    gib = 2 ** 30
    dev = {"name": "NVIDIA A100-SXM4-40GB", "memory_total": 40 * gib, "util_memory": 10,
           "power_mw": 250500, "mps_processes": []}
    nvml = _fake_pynvml(monkeypatch, tmp_path, [
        {**dev, "uuid": "GPU-0", "memory_used": 9 * gib, "util_gpu": 87,
         "processes": [{"pid": fake_rank.pid, "used_memory": gib}]},
        {**dev, "uuid": "GPU-1", "memory_used": gib, "util_gpu": 5,
         "processes": [{"pid": 999999, "used_memory": gib}]}])  # someone else's
    try:
        gpus = GpuSource().sample([fake_rank.pid])
    finally:
        nvml.shutdown()
    assert [g["index"] for g in gpus] == [0, 1]
    assert gpus[0]["ranks"] == [3] and gpus[1]["ranks"] == []
    assert gpus[0]["util_pct"] == 87 and gpus[0]["power_w"] == pytest.approx(250.5)
    assert gpus[0]["mem_used_bytes"] == 9 * gib and gpus[0]["mem_total_bytes"] == 40 * gib
    assert "pids" not in gpus[0]


def test_no_driver_means_no_gpus_and_no_error(tmp_path, monkeypatch):
    monkeypatch.delenv("FAKE_PYNVML_CONFIG", raising=False)
    nvml = _fake_pynvml(monkeypatch, tmp_path, [])
    monkeypatch.delenv("FAKE_PYNVML_CONFIG")  # the fake now behaves as a host without driver
    try:
        assert GpuSource().sample([]) == []
    finally:
        nvml.shutdown()


def test_rich_output_printed_during_the_live_view_lands_above_it(tmp_path, monkeypatch):
    """A command's rich table printed mid-run must not be drawn inside (and erased by) the view."""
    screen = FakeTTY()
    term_out, term_err = FakeTTY(), FakeTTY()
    monkeypatch.setattr(sys, "stdout", term_out)
    monkeypatch.setattr(sys, "stderr", term_err)
    Journal(tmp_path).emit("run_started", kind="tune", command=["train.py"], cwd=".")
    console = Console(file=screen, force_terminal=True, width=100, height=40)
    m = Monitor(tmp_path, console=console, stream=term_err)
    m.start_live()
    m.step()
    t = Table(title="autotune tune")
    t.add_column("knobs")
    t.add_row("batch_size=64")
    Console(file=sys.stdout, force_terminal=True, width=100).print(t)
    print("WARNING: something the command says", file=sys.stderr)
    sys.stdout.write("epoch 1 10%\repoch 1 100%\n")
    m.close()
    assert sys.stdout is term_out and sys.stderr is term_err  # put back
    assert term_out.getvalue() == "" and term_err.getvalue() == ""  # all went via the view
    text = ANSI.sub("", screen.getvalue())
    for line in ("batch_size=64", "WARNING: something the command says", "epoch 1 100%"):
        assert line in text
        assert text.index(line) < text.rindex("autotune tune · train.py")  # above the last frame
    assert "epoch 1 10%" not in text
