"""Several tuners, one study, on a real PostgreSQL server (`pgserver` ships the binaries).

Concurrent tuners on one ``--storage``/``--study-name`` measure no config twice and lose no
trial; a tuner killed with SIGKILL mid-trial leaves no rank behind, its trial is failed by
Optuna's heartbeat and re-run (once) by the tuner still working.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from autotune.store.journal import read_events
from autotune.tuning import study as studies
from conftest import SCRIPTS, trial_processes

pytestmark = pytest.mark.slow

optuna = pytest.importorskip("optuna")
TOY = str(SCRIPTS / "tune_toy.py")
FINISHED = ("COMPLETE", "PRUNED", "FAIL")


@pytest.fixture
def postgres():
    """A fresh server's URL. Its data dir is outside pytest's private (0700) tmp: run as root,
    pgserver runs PostgreSQL as another user, which must reach it."""
    pgserver = pytest.importorskip("pgserver", reason="pgserver (the test extra) is not installed")
    pytest.importorskip("psycopg", reason="psycopg (the test extra) is not installed")
    data = tempfile.mkdtemp(prefix="autotune-pg-")
    try:
        srv = pgserver.get_server(data, cleanup_mode="stop")
    except Exception as exc:  # noqa: BLE001 - any reason the server cannot start
        shutil.rmtree(data, ignore_errors=True)
        pytest.skip(f"pgserver could not start a PostgreSQL server: {exc}")
    yield srv.get_uri()
    srv.cleanup()
    shutil.rmtree(data, ignore_errors=True)


def tuner(tmp_path, name, url, *extra, trials=4, seed=1) -> subprocess.Popen:
    runs = tmp_path / f"runs-{name}"
    cmd = [sys.executable, "-m", "autotune", "tune", "--plain", "--foreign-limit", "1000",
           "--trials", str(trials), "--seconds", "5", "--confirm-rounds", "0", "--seed",
           str(seed), "--space", "batch_size=8:64", "--fix", "threads=1", "--no-warm-start",
           "--storage", url, "--study-name", "shared", "--runs-dir", str(runs),
           "--recipe-dir", str(tmp_path / f"recipes-{name}"), *extra, "--", TOY, "--work", "1"]
    return subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=open(tmp_path / f"{name}.err", "w"), start_new_session=True)


def said_why(err: Path) -> str:
    """What a tuner that failed said: its error lines and its last lines (a whole log would be
    cut by pytest's assertion report before the reason)."""
    lines = err.read_text(errors="replace").splitlines()
    why = [ln for ln in lines if "ERROR" in ln or "Traceback" in ln or "Error:" in ln]
    return "\n".join([*why[:5], "...", *lines[-6:]])


def run_dir_of(tmp_path, name) -> Path | None:
    found = list((tmp_path / f"runs-{name}").glob("*"))
    return found[0] if found else None


def measured(run_dir) -> list[dict]:
    """Knobs of the search probes this tuner took (the baseline apart: each tuner has one)."""
    evs, _ = read_events(run_dir)
    return [e["knobs"] for e in evs if e["event"] == "trial_started"
            and str(e.get("trial", "")).startswith("trial-") and e.get("mode") == "full"]


def shared_trials(url):
    return optuna.load_study(study_name="shared", storage=url).trials


def test_concurrent_tuners_share_one_study(tmp_path, postgres):
    t0 = time.monotonic()
    procs = [tuner(tmp_path, n, postgres, seed=s) for n, s in (("a", 1), ("b", 2))]
    codes = [p.wait(timeout=400) for p in procs]
    took_s = time.monotonic() - t0
    assert codes == [0, 0], "\n".join(
        f"tuner {n} exit {c}: " + said_why(tmp_path / f"{n}.err")
        for n, c in zip(("a", "b"), codes) if c)
    trials = shared_trials(postgres)
    states = [t.state.name for t in trials]
    assert "RUNNING" not in states, states  # no trial lost
    done = [t for t in trials if t.state.name in FINISHED]
    assert all(t.user_attrs.get("outcome") or t.user_attrs.get("interrupted") for t in done)
    probes = [k for n in ("a", "b") for k in measured(run_dir_of(tmp_path, n))]
    keys = [json.dumps(k, sort_keys=True) for k in probes]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    print(f"\n2 tuners: {len(trials)} study trials ({states.count('COMPLETE')} complete, "
          f"{states.count('PRUNED')} pruned, {states.count('FAIL')} failed, "
          f"{states.count('WAITING')} waiting), {len(probes)} probes, {took_s:.0f} s")
    assert not twice, f"concurrent tuners measured {len(twice)} config(s) twice: {twice}"


def test_a_killed_tuner_s_trial_is_retried_by_another(tmp_path, postgres):
    a = tuner(tmp_path, "a", postgres, trials=6, seed=1)
    deadline = time.monotonic() + 240
    markers: list[str] = []
    try:
        while time.monotonic() < deadline:  # until A has a search trial in flight
            run_dir = run_dir_of(tmp_path, "a")
            live = run_dir / "live.json" if run_dir else None
            if live and live.exists() and measured(run_dir):
                markers = json.loads(live.read_text()).get("markers", [])
                running = [t for t in shared_trials(postgres) if t.state.name == "RUNNING"]
                if markers and running:
                    break
            assert a.poll() is None, (tmp_path / "a.err").read_text()[-2000:]
            time.sleep(0.3)
        else:
            pytest.fail("tuner A had no trial in flight within the deadline")
        t_kill = time.monotonic()
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=10)
    finally:
        if a.poll() is None:
            os.killpg(a.pid, signal.SIGKILL)
    killed = [t for t in shared_trials(postgres) if t.state.name == "RUNNING"]
    assert len(killed) == 1
    # The ranks stop when their controller is gone (their meter notices): none survives.
    gone_by = time.monotonic() + 30
    while time.monotonic() < gone_by and any(trial_processes(m) for m in markers):
        time.sleep(0.5)
    ranks_gone_s = time.monotonic() - t_kill
    assert not any(trial_processes(m) for m in markers), "the killed tuner's ranks lingered"

    b = tuner(tmp_path, "b", postgres, trials=10, seed=2)
    code = b.wait(timeout=500)
    took_s = time.monotonic() - t_kill
    assert code == 0, (tmp_path / "b.err").read_text()[-2000:]
    after = {t.number: t for t in shared_trials(postgres)}
    assert after[killed[0].number].state.name == "FAIL"
    retries = [t for t in after.values()
               if t.system_attrs.get("failed_trial") == killed[0].number]
    assert len(retries) == 1, [(t.number, t.state.name, t.system_attrs) for t in after.values()]
    retry = retries[0]
    assert retry.params == killed[0].params
    assert retry.state.name in ("COMPLETE", "PRUNED"), retry.state
    b_run_id = json.loads((run_dir_of(tmp_path, "b") / "tune.json").read_text())["run_id"]
    assert retry.user_attrs.get("run") == b_run_id
    assert "RUNNING" not in [t.state.name for t in after.values()]
    print(f"\nkilled tuner A mid trial {killed[0].number}; its ranks gone in {ranks_gone_s:.1f} s; "
          f"B re-ran it as trial {retry.number} ({retry.state.name}); "
          f"{len(after)} study trials; {took_s:.0f} s from the kill to B's end "
          f"(heartbeat {studies.HEARTBEAT_S} s, grace {studies.GRACE_S} s)")
