"""Probes-side pieces for third-party scripts: the sitecustomize start, forked children, and the
trial's pure helpers (the write watch: test_write_watch.py). Subprocesses where a hook could
leak into pytest."""

import os
import subprocess
import sys
import textwrap
import time

import types

import pytest

from autotune import Note, NoteKind
from autotune.launching import group, rank_command
from autotune.measuring import probe_state, reading, series
from autotune.launching.collector import Collector
from autotune.launching.rank_command import PROJECT_ROOT, SITE_DIR
from autotune.measuring.outcome import Outcome
from autotune.measuring.probe_state import TrialSpec
from autotune.measuring.metric import MetricLog, parse_metric
from probes import autostart, protocol


def run_py(code, *, env=None, cwd=None, timeout=120):
    full = dict(os.environ)
    for var in (protocol.ENV_ADDR, protocol.ENV_TOKEN, *protocol.KNOB_ENV.values()):
        full.pop(var, None)
    full["PYTHONPATH"] = str(PROJECT_ROOT)
    full.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def received(collector, timeout_s=5.0):
    """Messages until the collector has been quiet a moment (connections send a bye last)."""
    out, quiet_until = [], time.monotonic() + 1.0
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < min(deadline, quiet_until):
        got = collector.drain()
        if got:
            out += got
            quiet_until = time.monotonic() + 1.0
        time.sleep(0.05)
    return out


# -- sitecustomize / autostart ----------------------------------------------------------------
@pytest.mark.parametrize("argv, started", [
    (["python", "train.py"], True),
    (["python", "-m", "pkg.train", "--bs", "3"], True),
    (["python", "-u", "-m", "pkg.train"], True),
    (["python", "-c", "import torch"], True),
    (["python", "-m", "probes.boot", "train.py"], False),
    (["python", "-mprobes.boot", "train.py"], False),
    (["python", "-m", "torch.distributed.run", "train.py"], False),
    (["python", "/venv/bin/torchrun", "--nproc-per-node", "2", "train.py"], False),
    (["python", "/venv/lib/python3.11/site-packages/torch/_inductor/compile_worker/__main__.py",
      "--workers=2"], False),
    (["python", "/home/u/torch/train.py"], True),
    (["python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5)",
      "--multiprocessing-fork"], False),
    (["python", "-c", "from multiprocessing.resource_tracker import main;main(5)"], False),
])
def test_which_processes_the_sitecustomize_meters(argv, started):
    assert (autostart.plan(argv, {protocol.ENV_ADDR: "127.0.0.1:1"}) == autostart.NOW) \
        is started
    assert autostart.plan(argv, {}) is None


def test_python_path_puts_the_site_dir_first_and_the_user_s_entries_before_the_root():
    """Installed, the project root is site-packages: ahead of the user's entries it shadowed
    their own copies of installed packages."""
    assert (PROJECT_ROOT / "probes" / "protocol.py").is_file() and SITE_DIR.is_dir()
    assert rank_command.python_path("") == os.pathsep.join([str(SITE_DIR), str(PROJECT_ROOT)])
    user = os.pathsep.join(["/a", str(PROJECT_ROOT), "/b"])
    assert rank_command.python_path(user) == os.pathsep.join([str(SITE_DIR), "/a", "/b",
                                                              str(PROJECT_ROOT)])


def site_env(collector, *extra):
    return {**collector.env(), "PYTHONPATH": os.pathsep.join([rank_command.python_path(""), *extra])}


def test_sitecustomize_meters_a_torch_process_once(tmp_path):
    user_site = tmp_path / "user"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text("print('user sitecustomize ran')\n")
    collector = Collector()
    try:
        done = run_py("""
            import sys
            print("torch before:", "torch" in sys.modules)
            import torch
            from torch.utils.data import DataLoader
            for batch in DataLoader(list(range(40)), batch_size=8):
                pass
        """, env=site_env(collector, str(user_site)))
        msgs = [m.msg for m in received(collector)]
    finally:
        collector.close()
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[:2] == ["user sitecustomize ran", "torch before: False"]
    kinds = [m["type"] for m in msgs]
    assert kinds.count("hello") == 1 and kinds[-1] == "bye"
    assert [m["samples"] for m in msgs if m["type"] == "tick"][-1] == 40


def test_sitecustomize_leaves_processes_without_torch_and_the_boot_runner_alone(tmp_path):
    collector = Collector()
    try:
        plain = run_py("import sys; print('torch' in sys.modules)", env=site_env(collector))
        script = tmp_path / "train.py"
        script.write_text("import torch\ntorch.zeros(2).sum()\n")
        env = dict(os.environ, **site_env(collector))
        booted = subprocess.run([sys.executable, "-m", "probes.boot", str(script)], env=env,
                                capture_output=True, text=True, timeout=120)
        msgs = [m.msg for m in received(collector)]
    finally:
        collector.close()
    assert plain.returncode == 0 and plain.stdout.strip() == "False"
    assert booted.returncode == 0, booted.stderr
    assert [m["type"] for m in msgs].count("hello") == 1  # the runner's; no second start


def test_sitecustomize_reports_an_uncaught_exception(tmp_path):
    collector = Collector()
    try:
        done = run_py("import torch\nraise RuntimeError('CUDA error: out of memory')",
                      env=site_env(collector))
        msgs = [m.msg for m in received(collector)]
    finally:
        collector.close()
    assert done.returncode == 1 and "Traceback" in done.stderr
    error = next(m for m in msgs if m["type"] == "error")
    assert error["kind"] == "oom" and error["exc_type"] == "RuntimeError"


# -- synthetic replay and the end of the script's data ------------------------------------------
EPOCHS = """
import time, torch
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):  # 8 batches of 8 samples, 5 ms each: 40 ms a batch, 0.32 s an epoch
    def __len__(self):
        return 64

    def __getitem__(self, i):
        time.sleep(0.005)
        return torch.zeros(4)

loader = DataLoader(Slow(), batch_size=8)
for epoch in range(2):
    t = time.monotonic()
    n = sum(1 for _ in loader)
    print(f"for {n} {time.monotonic() - t:.3f}", flush=True)
it, n, t = iter(loader), 0, time.monotonic()
while True:
    try:
        next(it)
    except StopIteration:
        break
    n += 1
print(f"next {n} {time.monotonic() - t:.3f}", flush=True)
"""


@pytest.mark.parametrize("mode", ["full", "synthetic"])
def test_a_replayed_epoch_lasts_as_long_as_the_real_loaders(tmp_path, mode):
    """Synthetic mode replays the cached batches until the real loader, at the pace the script
    took them, would have yielded its epoch: no sooner (the data of a ``next(it)`` script ran out
    within seconds), and the epochs still end (two ``for`` epochs, then the ``next`` loop)."""
    script = tmp_path / "epochs.py"
    script.write_text(EPOCHS)
    env = {k: v for k, v in os.environ.items()
           if k not in (protocol.ENV_ADDR, protocol.ENV_TOKEN, *protocol.KNOB_ENV.values())}
    env.update({"PYTHONPATH": str(PROJECT_ROOT), protocol.ENV_MODE: mode})
    done = subprocess.run([sys.executable, "-m", "probes.boot", str(script)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    epochs = [line.split() for line in done.stdout.splitlines()]
    assert [e[0] for e in epochs] == ["for", "for", "next"], done.stdout
    for _, batches, seconds in epochs:
        assert float(seconds) >= 0.3, epochs  # 8 batches of 40 ms, replayed or not
        if mode == "full":
            assert int(batches) == 8, epochs
    if mode == "synthetic":  # the replay is far faster than the sleeps: more batches fit
        assert all(int(batches) > 8 for _, batches, _ in epochs[1:]), epochs


def test_ranks_of_a_process_group_end_their_replayed_epochs_together(tmp_path):
    """Each rank's pace is its own (here 5 ms and 1 ms a sample): in a group of two, a
    replayed epoch ends at the loader's length on both, as torch's does, so the ranks meet in
    the same collectives (an epoch's count allreduced). The script ends its group, as torch asks:
    a gloo group left to the interpreter's exit aborts one run in ten, probe or not."""
    script = tmp_path / "group.py"
    script.write_text(EPOCHS.replace("time.sleep(0.005)", "time.sleep(SLEEP_S)").replace(
        "import time, torch\n", "import os, time, torch\nimport torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "SLEEP_S = 0.005 if dist.get_rank() == 0 else 0.001\n").replace(
        '    print(f"for {n}', '    c = torch.tensor([n]); dist.all_reduce(c)\n'
        '    print(f"for {n} {int(c)}') + "dist.destroy_process_group()\n")
    base = {k: v for k, v in os.environ.items()
            if k not in (protocol.ENV_ADDR, protocol.ENV_TOKEN, *protocol.KNOB_ENV.values())}
    port = group.free_port()
    ranks = [subprocess.Popen(
        [sys.executable, "-m", "probes.boot", str(script)],
        env={**base, "PYTHONPATH": str(PROJECT_ROOT), protocol.ENV_MODE: "synthetic",
             "RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(port)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    try:
        outs = [p.communicate(timeout=120) for p in ranks]
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (out, err) in zip(ranks, outs):
        assert p.returncode == 0, err
        assert [line.split()[:3] for line in out.splitlines()][:2] == [["for", "8", "16"]] * 2


def test_an_uncaught_stop_iteration_is_reported_as_the_data_running_out(tmp_path):
    collector = Collector()
    try:
        env = {k: v for k, v in os.environ.items()
               if k not in (protocol.ENV_MODE, *protocol.KNOB_ENV.values())}
        env.update(PYTHONPATH=str(PROJECT_ROOT), **collector.env())
        done = subprocess.run([sys.executable, "-m", "probes.boot",
                               str(PROJECT_ROOT / "tests" / "scripts" / "shape_next_it.py"),
                               "--samples", "64", "--sample-ms", "0"], env=env,
                              capture_output=True, text=True, timeout=120)
        msgs = [m.msg for m in received(collector)]
    finally:
        collector.close()
    assert done.returncode == 1 and "StopIteration" in done.stderr  # as python would end it
    error = next(m for m in msgs if m["type"] == "error")
    assert (error["kind"], error["exc_type"]) == (protocol.ERROR_STOP_ITERATION, "StopIteration")
    assert next(m for m in msgs if m["type"] == "bye")["exit_code"] == 1
    assert [m["batches"] for m in msgs if m["type"] == "tick"][-1] == 4


# -- forked children ----------------------------------------------------------------------------
def test_a_forked_child_reports_on_its_own_connection():
    collector = Collector()
    try:
        done = run_py("""
            import multiprocessing as mp
            import torch
            from probes import protocol
            from probes.meter import Meter

            meter = Meter()
            meter.connect()

            def child():
                meter.send(protocol.SEEN, what="from-the-child-too-early", note="")
                for _ in range(3):
                    meter.count_batch(torch.zeros(5), training=True)

            p = mp.get_context("fork").Process(target=child)
            p.start()
            p.join()
            meter.send(protocol.SEEN, what="parent-still-here", note="")
            meter.close(exit_code=p.exitcode)
        """, env=collector.env())
        got = received(collector)
    finally:
        collector.close()
    assert done.returncode == 0, done.stderr
    by_conn = {}
    for r in got:
        by_conn.setdefault(r.conn_id, (r.hello, []))[1].append(r.msg)
    assert len(by_conn) == 2
    (parent_hello, parent), (child_hello, child) = sorted(by_conn.values(),
                                                          key=lambda v: v[0].get("sub", False))
    assert child_hello["sub"] is True
    assert [m["what"] for m in parent if m["type"] == "seen"] == ["parent-still-here"]
    assert parent[-1]["type"] == "bye"
    assert [m["samples"] for m in child if m["type"] == "tick"][-1] == 15  # the last tick sent
    assert child[-1]["type"] == "bye"


# -- trial helpers --------------------------------------------------------------------------------
def spec(*args, **over):
    return TrialSpec.of(command=("train.py", *args), **over)


def test_samples_per_step_sources():
    assert series.samples_per_step(("t.py", "--bs", "8"), {}, 12)[0] == 12
    n, note = series.samples_per_step(("t.py", "--batch-size", "{batch_size}"),
                                       {"batch_size": 64}, None)
    assert n == 64 and "{batch_size}" in note
    n, note = series.samples_per_step(("t.py", "--trainer.batch_size=24"), {}, None)
    assert n == 24 and "'--trainer.batch_size=24'" in note
    assert series.samples_per_step(("t.py", "--bs", "auto"), {}, None) == (None, "")
    assert series.samples_per_step(("t.py", "--lr", "3"), {}, None) == (None, "")


def test_a_value_resolved_once_keeps_the_name_of_its_source():
    """The tuner resolves samples per step (`series.samples_per_step`) and the trial sees the
    number again as given: the note still names the placeholder, not --samples-per-step."""
    cmd, knobs = ("t.py", "--bs", "{batch_size}"), {"batch_size": 16}
    n, _ = series.samples_per_step(cmd, knobs, None)
    assert series.samples_per_step(cmd, knobs, n) == (16, "samples per step: 16, the value of "
                                                          "{batch_size}")
    assert "from --samples-per-step" in series.samples_per_step(cmd, knobs, 64)[1]


def test_steps_else_backwards_is_one_rule_for_the_trial_its_series_and_the_full_run():
    """Under gradient accumulation (4 backward passes per optimizer step) every count is steps
    (the trial counted backward passes, its series and the full run steps)."""
    from autotune.measuring import fullrun

    tick = {"type": "tick", "steps": 2, "backwards": 8, "samples": 0, "first_step_t": 1.0,
            "last_step_t": 2.0}
    assert series.step_count(tick) == 2 and series.step_count({"backwards": 8}) == 8
    assert series.tick_points({}, tick, 0.0)[1][-1] == (2.0, 2)
    probe = probe_state.ProbeState(spec(), None)
    probe.ranks[0] = probe_state.RankState(hello={}, tick=tick)
    assert probe.totals() == (0, 2)
    meter = fullrun._Meter(samples_per_step=4)
    meter.ticks[0] = tick
    assert meter.totals() == (8, 2)


def test_watch_env(tmp_path):
    script = tmp_path / "code" / "train.py"
    script.parent.mkdir()
    script.write_text("")
    env = series.watch_env((str(script),), str(tmp_path), None)
    assert env[protocol.ENV_WATCH_DIRS].split(os.pathsep) == [str(tmp_path.resolve()),
                                                             str(script.parent.resolve())]
    assert env[protocol.ENV_SCRATCH_DIR] == ""
    area = tmp_path / "probe"
    area.mkdir()
    env = series.watch_env((str(script),), str(area), (str(tmp_path),))
    assert env[protocol.ENV_WATCH_DIRS] == str(tmp_path.resolve())
    assert env[protocol.ENV_SCRATCH_DIR] == str(area.resolve())


def tick(t, samples, first, last):
    return {"type": "tick", "t": t, "samples": samples, "batches": samples // 4, "steps": 0,
            "backwards": 0, "first_batch_t": first, "last_batch_t": last, "last_step_t": 0}


def test_ticks_bound_idle_stretches_with_first_batch_points():
    probe = probe_state.ProbeState(spec(), None)
    rank = probe_state.RankState(hello={})
    for msg in (tick(10.0, 40, 9.8, 9.99), tick(10.25, 80, 10.01, 10.24), tick(10.5, 80, 0, 10.24),
                tick(10.75, 100, 10.6, 10.74)):
        probe._tick(rank, msg["t"] + 100.0, msg)
    assert series.on_our_clock(rank.batch_points, rank.offset) == [
        (109.8, 0), (109.99, 40), (110.01, 40), (110.24, 80), (110.6, 80), (110.74, 100)]


def test_every_point_is_brought_to_our_clock_by_the_least_delay_seen_not_its_own_tick_s():
    """Steps of 1 s on the rank's clock; the first ticks reached us 0.5 s late (a loaded
    controller), the later ones at once. Each point shifted by its own tick's delay put the
    first steps late and read the steps 12% faster than the script stepped."""
    probe = probe_state.ProbeState(spec(), None)
    rank = probe_state.RankState(hello={})
    delays = [0.5, 0.5, 0.5, 0.0, 0.0, 0.0, 0.0]
    for i, delay in enumerate(delays):
        t = 10.0 + i  # a step ends at t, its tick leaves just after
        msg = {"t": t + 0.01, "batches": 0, "samples": 0, "steps": i + 1,
               "first_step_t": t, "last_step_t": t}
        probe._tick(rank, msg["t"] + 100.0 + delay, msg)
    points = series.on_our_clock(rank.step_points, rank.offset)
    # one step a second, as the script stepped (tick by tick: 110.5, 111.5, 112.5, 113, ...)
    assert sorted({t for t, _ in points}) == pytest.approx([110.0 + i for i in range(7)])


def test_metric_reasons():
    log = MetricLog(parse_metric(r"(?P<ms_per_step>\d+) ms"))
    reason = series.metric_reason(log, batch_known=False, ran_s=12.0, log_path="/r/t.log")
    assert "matched no line" in reason and "/r/t.log" in reason
    log.feed("step 1 20 ms\nstep 2 20 ms\n", 1.0)
    reason = series.metric_reason(log, batch_known=False, ran_s=12.0, log_path="/r/t.log")
    assert "put {batch_size} in the script's args" in reason
    reason = series.metric_reason(log, batch_known=True, ran_s=12.0, log_path="/r/t.log")
    assert "only 2 lines matched" in reason


def test_notes_on_sources_disagreement_and_writes():
    assert series.notes(source=series.Source.STEPS, step_note="samples per step: 8", metric_rate=0,
                         counted_rate=0, writes={}) == [Note.info("samples per step: 8")]
    assert series.notes(source=series.Source.DATALOADER, step_note="samples per step: 8", metric_rate=0,
                         counted_rate=0, writes={}) == []
    agree = series.notes(source=series.Source.METRIC, step_note="", metric_rate=110.0, counted_rate=100.0,
                          writes={})
    twice = series.notes(source=series.Source.METRIC, step_note="", metric_rate=200.0, counted_rate=100.0,
                          writes={})
    assert agree == [] and "rank_samples_per_s" in twice[0].text
    assert twice[0].kind is NoteKind.WARNING
    written = {"/t/a": {"existed": True}, "/t/b": {"existed": False}}
    note, = series.notes(source=series.Source.DATALOADER, step_note="", metric_rate=0, counted_rate=0,
                          writes=written)
    assert "/t/a, /t/b (1 existed before)" in note.text and "--probe-cwd" in note.text
    assert note.kind is NoteKind.WARNING


def test_a_count_is_read_over_the_span_asked_and_only_where_it_covers_it():
    # 100 samples/s for 10 s, then 50 samples/s: the count over the metric's window, not its own
    points = [(float(t), 100.0 * t) for t in range(11)] + [(10.0 + t, 1000.0 + 50 * t)
                                                            for t in range(1, 11)]
    assert series.rate_over(points, 2.0, 8.0) == pytest.approx(100.0)
    assert series.rate_over(points, 12.5, 19.5) == pytest.approx(50.0)
    assert series.rate_over(points, 5.0, 15.0) == pytest.approx(75.0)
    assert series.rate_over(points, -1.0, 8.0) == 0.0  # before the count began
    assert series.rate_over(points, 2.0, 21.0) == 0.0  # after it ended
    assert series.rate_over(points, 8.0, 8.0) == 0.0
    assert series.rate_over(points[:1], 0.0, 0.0) == 0.0


def test_a_probe_looks_for_its_processes_at_most_once_a_walk_interval(monkeypatch):
    class Launch:
        walks = 0

        def tree(self):
            Launch.walks += 1
            return [types.SimpleNamespace(pid=100 + Launch.walks)]

    probe = probe_state.ProbeState(spec(), None)
    probe.launched = [Launch()]
    first = probe.processes()
    assert probe.processes() is first and Launch.walks == 1  # within TREE_EVERY_S: the same
    monkeypatch.setattr(probe_state, "TREE_EVERY_S", 0.0)
    assert [p.pid for p in probe.processes()] == [102] and Launch.walks == 2


def test_an_error_after_the_stop_is_teardown_unless_out_of_memory():
    from autotune.launching.collector import Received

    probe = probe_state.ProbeState(spec(), None)
    gloo = {"type": "error", "kind": "exception", "exc_type": "RuntimeError",
            "message": "Connection closed by peer"}
    probe.absorb([Received(t=5.0, conn_id=1, hello={}, msg=dict(gloo))])
    probe.stop_t = 10.0
    probe.absorb([Received(t=10.5, conn_id=2, hello={}, msg=dict(gloo)),
                  Received(t=10.6, conn_id=3, hello={}, msg=dict(gloo, kind="oom"))])
    assert probe.ranks[1].error is not None  # before the stop: the script's own failure
    assert probe.ranks[2].error is None and probe.ranks[2].teardown is not None
    assert probe.ranks[3].error is not None  # out of memory says something about the config


def ended(tmp_path, exit_codes, messages, *, stop_t=None, launcher="local"):
    """A probe's result from what its ranks said (``(t, conn, hello, msg)``) and how its
    processes ended, as `run_trial` computes it at the end."""
    from autotune.launching import engines
    from autotune.launching.collector import Received
    from autotune.measuring.foreign_load import ForeignLoad

    probe = probe_state.ProbeState(spec(foreign_limit_cores=1e9,
                              launcher=engines.Launcher(kind=launcher)), None)
    probe.stop_t = stop_t
    probe.stopped_by_us = stop_t is not None
    probe.absorb([Received(t=t, conn_id=c, hello=h, msg=m) for t, c, h, m in messages])
    (tmp_path / "t.log").write_text("")
    return reading.result_of(probe, exit_codes, ForeignLoad(), tmp_path / "t.log")


PARENT = {"rank": 0}
CHILD = {"rank": 0, "sub": True}
GLOO = {"type": "error", "kind": "exception", "exc_type": "RuntimeError",
        "message": "Connection closed by peer"}


def bye(code, stopped=False):
    return {"type": "bye", "exit_code": code, "stopped": stopped}


def test_a_spawned_rank_pulled_out_by_our_stop_does_not_make_its_parent_a_crash(tmp_path):
    # child 1 left on the stop, child 2 was in an allreduce with it; mp.spawn then raised
    r = ended(tmp_path, [1], [(11.0, 2, CHILD, bye(0, stopped=True)),
                              (11.1, 3, CHILD, GLOO), (11.2, 3, CHILD, bye(1)),
                              (11.5, 1, PARENT, bye(1))], stop_t=10.0)
    assert r.outcome != Outcome.CRASHED and "exited" not in r.reason, (r.outcome, r.reason)


def test_a_rank_that_failed_before_the_stop_is_a_crash_with_its_own_code(tmp_path):
    # under mpirun: rank 1 exited 5 on its own; Hydra folded SIGTERM into its own 15
    r = ended(tmp_path, [15], [(9.0, 2, {"rank": 1}, bye(5)), (10.5, 1, {"rank": 0}, bye(0))],
              stop_t=10.0, launcher="mpirun")
    assert r.outcome == Outcome.CRASHED and r.exit_code == 5, (r.outcome, r.reason)
    # a spawned child's failure is its parent's to report, not the job's code by itself
    r = ended(tmp_path, [0], [(9.0, 2, CHILD, bye(3))], stop_t=10.0)
    assert r.exit_code == 0 and r.outcome != Outcome.CRASHED, (r.outcome, r.reason)
