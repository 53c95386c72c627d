"""Third-party training scripts as they come, probed end to end with real (tiny) CPU training.

Every script prints its own throughput with running totals (``train_samples N train_s T``, its
clock around the training loop only). Where autotune's figure is compared with it, both come
from the same process over nearly the same stretch of it, so they agree closely however loaded
the machine is; 5% is the bar the issue sets.
"""

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest

from autotune import Note, NoteKind
from autotune.measuring.outcome import Outcome
from autotune.measuring.trial import TrialSpec, run_trial
from conftest import ROOT, SCRIPTS, live_children, trial_processes

pytestmark = pytest.mark.slow

SAMPLES_PER_S = r"samples/s (?P<samples_per_s>[\d.]+)"
MS_PER_STEP = r"ms/step (?P<ms_per_step>[\d.]+)"
WARMUP_S = 1.5  # the script's own figure starts after this much training time
# for a probe whose figure no test compares: it ends once it has any estimate
ANY_FIGURE = {"target_rel": 0.5, "min_measure_s": 1.0}


def probe(tmp_path, command, **over):
    name = f"s{uuid.uuid4().hex[:8]}"
    spec = dict(command=tuple(command), cwd=str(tmp_path), log_dir=tmp_path / "logs", name=name,
                knobs={"threads": 1}, max_s=25.0, min_measure_s=3.0, target_rel=0.08,
                hang_s=10.0, startup_s=30.0, foreign_limit_cores=1e9,
                grace_s=10.0)  # a clean stop with a loader worker took over 3 s under CI's load
    spec.update(over)
    result = run_trial(TrialSpec.of(**spec))
    assert trial_processes(name) == [], "a process of the trial outlived it"
    assert live_children() == [], "a child of the controller outlived the trial"
    return result


def script(name, *args):
    return (str(SCRIPTS / name), *args)


def log(result, rank=0):
    path = Path(result.log_path)
    if rank:
        path = path.with_name(path.stem + f".rank{rank}.log")
    return path.read_text(errors="replace")


def own_rate(text, *, prefix="", after_s=WARMUP_S):
    """The script's own samples/s from its running totals, after its first ``after_s`` s."""
    rows = [(float(n), float(t)) for n, t in
            re.findall(prefix + r".*?train_samples (\d+) train_s ([\d.]+)", text)]
    rows = [r for r in rows if r[1] >= after_s]
    assert len(rows) >= 3, f"too few progress lines after {after_s} s:\n{text[-2000:]}"
    (n0, t0), (n1, t1) = rows[0], rows[-1]
    return (n1 - n0) / (t1 - t0)


def own_rate_within(text, start_t, end_t, *, prefix=""):
    """The script's own samples/s over the probe's window (``start_t`` to ``end_t`` on the
    system's monotonic clock), from the running totals it printed with ``at T``: each end's
    total read between the two lines around it, so that both count the same span (read from
    the first line inside to the last, lines half a second apart left up to a second of an
    8 s window out of the script's count); an end past the lines is read at the line nearest
    it."""
    rows = sorted((float(t), float(n)) for n, t in
                  re.findall(prefix + r".*?train_samples (\d+) train_s [\d.]+ at ([\d.]+)",
                             text))
    inside = [r for r in rows if start_t <= r[0] <= end_t]
    assert len(inside) >= 3, f"too few progress lines in {start_t}-{end_t}:\n{text[-2000:]}"
    t0, t1 = max(start_t, rows[0][0]), min(end_t, rows[-1][0])
    return (_total_at(rows, t1) - _total_at(rows, t0)) / (t1 - t0)


def _total_at(rows, t):
    """The running total at ``t``, between the (time, total) rows around it."""
    after = next(i for i, (u, _) in enumerate(rows) if u >= t)
    if after == 0:
        return rows[0][1]
    (ta, na), (tb, nb) = rows[after - 1], rows[after]
    return na + (nb - na) * (t - ta) / (tb - ta)


def agrees(ours, theirs, rel=0.05):
    return ours == pytest.approx(theirs, rel=rel)


def test_explicit_flag_wins_and_a_hard_coded_worker_count_is_tuned(tmp_path):
    r = probe(tmp_path, script("shape_flags.py", "-b", "8"),
              knobs={"batch_size": 32, "workers": 1, "threads": 1})
    assert r.outcome == Outcome.OK, r.reason
    assert "loader batch_size=8 num_workers=1" in log(r)
    assert r.seen["batch_size"] == 8 and r.seen["workers"] == 0
    note = next(n.text for n in r.notes if n.text.startswith("batch_size stays 8"))
    assert "'-b {batch_size}'" in note
    assert r.source == "dataloader" and r.exit_code == 0  # never ends: stopped cleanly
    assert agrees(r.samples_per_s, own_rate_within(log(r), r.window_start_t, r.window_end_t))


def test_placeholder_inside_a_dotted_override_and_an_epoch_that_ends_first(tmp_path):
    # a precision no window reaches and a window no loaded machine fills: the epoch ends first
    r = probe(tmp_path, script("shape_flags.py", "--trainer.batch_size={batch_size}",
                               "--epochs", "1", "--samples", "2400"),
              knobs={"batch_size": 16, "threads": 1}, target_rel=1e-4, max_s=120.0)
    text = log(r)
    assert "loader batch_size=16 " in text and "done: 1 epochs" in text
    assert r.outcome == Outcome.ENDED and r.ok, r.reason  # its figure stands, and it ended
    assert r.reason.startswith("the script ended on its own (exit 0) after 150 batches")
    assert r.exit_code == 0 and r.duration_s < 120.0
    assert not [n for n in r.notes if "stays" in n.text]  # a placeholder is not an explicit value
    # over the probe's own window: on a loaded machine the script's pace fell by half through
    # its one epoch (CI: 671 samples/s in its first half second, 375 in its last)
    assert agrees(r.samples_per_s, own_rate_within(text, r.window_start_t, r.window_end_t))


def test_no_dataloader_steps_times_the_batch_placeholder(tmp_path):
    r = probe(tmp_path, script("shape_tensor.py", "--batch-size", "{batch_size}"),
              knobs={"batch_size": 16, "threads": 1})
    assert r.outcome == Outcome.OK, r.reason
    assert r.source == "steps"
    assert Note.info("samples per step: 16, the value of {batch_size}") in r.notes
    assert agrees(r.samples_per_s, own_rate_within(log(r), r.window_start_t, r.window_end_t))


def test_memmap_batches_weights_by_hand_and_ms_per_step_metric(tmp_path):
    r = probe(tmp_path, script("shape_tensor.py", "--batch-size", "{batch_size}",
                               "--source", "memmap", "--update", "manual"),
              knobs={"batch_size": 16, "threads": 1}, metric=MS_PER_STEP)
    assert r.outcome == Outcome.OK, r.reason
    assert r.source == "metric"
    # The meter's own count (backward passes: no optimizer) times 16, same process, same time.
    assert agrees(r.counted_samples_per_s, r.samples_per_s)
    assert agrees(r.samples_per_s, own_rate_within(log(r), r.window_start_t, r.window_end_t))
    assert "writes" not in r.seen  # the memmap lives in a temporary directory, not the tree


def test_pauses_are_left_out_and_checkpoints_in_the_tree_are_reported(tmp_path):
    precious = tmp_path / "ckpt.pt"
    precious.write_text("the user's own checkpoint")
    r = probe(tmp_path, script("shape_pauses.py", "--sample-s", "4", "--eval-every-s", "2",
                               "--eval-s", "0.6", "--ckpt-every", "25"),
              max_s=35.0, min_measure_s=4.0)
    assert r.outcome == Outcome.OK, r.reason
    text = log(r)
    assert "sample: " in text and "eval loss" in text
    # The script's own training-loop throughput, pauses off its clock...
    own = own_rate(text)
    assert agrees(r.samples_per_s, own)
    assert r.paused_s + r.warmup_s >= 4.0
    # ...and what a figure taken across the pauses would have said.
    n, wall = map(float, re.findall(r"train_samples (\d+) train_s [\d.]+ wall_s ([\d.]+)",
                                    text)[-1])
    assert n / wall < 0.85 * own
    writes = {w["path"]: w for w in r.seen["writes"]}
    assert writes[str(precious.resolve())]["existed"] is True
    assert any(n.kind is NoteKind.WARNING and n.text.startswith("the probe wrote into your tree")
               and "--probe-cwd" in n.text for n in r.notes)


def test_every_rank_printing_the_same_lines_counts_once(tmp_path):
    r = probe(tmp_path, script("shape_ddp.py"), instances=2, metric=SAMPLES_PER_S, max_s=35.0)
    assert r.outcome == Outcome.OK, r.reason
    assert r.source == "metric"
    assert "samples/s" in log(r, rank=1)  # rank 1 prints the same lines: not read
    # Both ranks' DataLoader counts, summed: the job's figure. Twice it would be a double count.
    # The counts and the lines end their spans at different batches: under CI's load the two
    # read 5.4% apart once (1,296 and 1,229 samples/s, the figure's interval ±98.7), so only a
    # double count's factor of two is asked about here; the figure against the script's own
    # lines over the same window is the exact check, below.
    assert agrees(r.samples_per_s, r.counted_samples_per_s, rel=0.15)
    assert agrees(r.samples_per_s, own_rate_within(log(r), r.window_start_t, r.window_end_t))


def test_a_script_setting_its_own_thread_count_is_overridden_with_a_note(tmp_path):
    r = probe(tmp_path, script("shape_threads.py"), knobs={"threads": 2}, max_s=15.0,
              **ANY_FIGURE)
    assert r.outcome == Outcome.OK, r.reason
    text = log(r)
    assert "threads after set_num_threads(3): 2" in text
    assert "worker 0 threads 1" in text  # DataLoader workers keep torch's single thread
    assert r.seen["threads"] == 3
    assert Note.info("the script's torch.set_num_threads call was overridden by autotune") \
        in r.notes


def test_hogwild_workers_are_measured_and_cleaned_up(tmp_path):
    r = probe(tmp_path, script("shape_hogwild.py", "--procs", "2"))
    assert r.outcome == Outcome.OK, r.reason
    assert r.source == "dataloader"
    text = log(r)
    pids = [int(p) for p in re.search(r"started 2 workers: (\d+) (\d+)", text).groups()]
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                   for p in pids)
    # over the probe's own window: the workers' whole-run rate moves with the machine's load
    own = sum(own_rate_within(text, r.window_start_t, r.window_end_t, prefix=f"worker {k} ")
              for k in (0, 1))
    assert agrees(r.samples_per_s, own)


def test_python_dash_m_package_with_the_users_own_sitecustomize(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SCRIPTS / "shape_site"),
                                                       str(SCRIPTS)]))
    r = probe(tmp_path, (sys.executable, "-m", "shape_pkg.train"), env=env,
              knobs={"batch_size": 8, "threads": 1})
    assert r.outcome == Outcome.OK, r.reason
    text = log(r)
    assert text.count("user sitecustomize ran") == 1
    assert "loader batch_size=8 num_workers=0" in text
    assert r.source == "dataloader" and r.seen["batch_size"] == 32
    assert agrees(r.samples_per_s, own_rate_within(text, r.window_start_t, r.window_end_t))


def test_shell_script_that_starts_python(tmp_path):
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    r = probe(tmp_path, script("shape_run.sh"), env=env,
              knobs={"batch_size": 8, "workers": 1, "threads": 1})
    assert r.outcome == Outcome.OK, r.reason
    text = log(r)
    assert "loader batch_size=8 num_workers=1" in text
    assert "shape_run.sh: training finished" in text and r.exit_code == 0
    assert r.source == "dataloader"
    # over the probe's own window: a loaded machine's start-up leaves the script slow for its
    # first seconds (CI: 203 samples/s, then 293), which a mean over its whole run would hold
    assert agrees(r.samples_per_s, own_rate_within(text, r.window_start_t, r.window_end_t))


def test_probe_cwd_keeps_the_probe_out_of_the_users_tree(tmp_path):
    user = tmp_path / "project"
    user.mkdir()
    (user / "ckpt.pt").write_text("the user's own checkpoint")
    area = user / "probe-area"
    argv = [sys.executable, "-m", "autotune", "probe", "--modes", "full", "--seconds", "15",
            "--json", "--plain", "--probe-cwd", str(area), "--metric", SAMPLES_PER_S,
            str(SCRIPTS / "shape_pauses.py"), "--sample-s", "0", "--eval-s", "0.3",
            "--log-s", "0.2"]  # a line every 0.2 s: enough of them on a starved CI worker
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(argv, cwd=user, env=env, capture_output=True, text=True, timeout=120)
    full = json.loads(done.stdout.strip().splitlines()[-1])["modes"]["full"]
    # Measured either way; on a machine shared with other work the probe is flagged as such.
    assert full["outcome"] in ("ok", "foreign-load"), full["reason"]
    assert done.returncode == 0, done.stderr[-3000:]  # measured (a foreign-load flag warns)
    assert full["source"] == "metric" and full["samples_per_s"] > 0
    assert "writes" not in full["seen"]
    assert (user / "ckpt.pt").read_text() == "the user's own checkpoint"
    assert (area / "ckpt.pt").stat().st_size > 0


@pytest.mark.parametrize("instances", [1, 2])
def test_a_script_asking_for_nccl_on_a_cpu_host_trains_on_gloo_and_is_told(tmp_path, instances):
    """nanoGPT's shape: DDP when RANK is set, backend 'nccl' by default; plain python trains on
    this CPU host, so a probe must too. One rank runs as plain python (no RANK: no process
    group); two ranks get torchrun's variables, and gloo in place of nccl, told in the notes."""
    r = probe(tmp_path, script("shape_nccl_default.py"), instances=instances,
              metric=SAMPLES_PER_S, max_s=30.0, **ANY_FIGURE)
    assert r.outcome == Outcome.OK, r.reason
    if instances == 1:
        assert "backend" not in r.seen and not any("nccl" in n.text for n in r.notes), r.notes
        return
    assert r.seen["backend"] == "gloo" and r.seen["world_size"] == instances
    assert any("asked for backend 'nccl'" in n.text and "'gloo'" in n.text for n in r.notes), r.notes
