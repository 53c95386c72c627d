"""The image example as 2 DDP ranks under a real mpirun, started by autotune: identity from the
MPI launcher's variables, placement table, meter and channel across the engine."""

import time
from pathlib import Path

import pytest

from autotune.launching import engines

from autotune.hardware import proc
from autotune.launching.collector import Collector
from autotune.launching.group import RanksSpec, start_group

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "image_classifier" / "train.py"

pytestmark = [pytest.mark.mpi, pytest.mark.slow]


def test_mpi4py_and_mpirun_agree(mpi):
    """Mixing MPI libraries gives singleton ranks: the launcher must match mpi4py's library."""
    library = engines.mpi4py_library()
    assert library, "mpi4py is installed but its MPI library does not load"
    assert engines.mpi_flavor(library) == mpi.flavor, (library, mpi)


def test_image_example_as_two_ddp_ranks_under_mpirun(mpi, tmp_path):
    collector = Collector()
    spec = RanksSpec(
        command=(str(EXAMPLE), "--num-images", "128", "--batch-size", "8", "--workers", "0",
                 "--max-steps", "12", "--epochs", "3", "--data-dir", str(tmp_path / "data"), "--log-interval",
                 "4"),
        knobs={"bucket_mb": 2}, instances=2, cwd=str(tmp_path), log_dir=tmp_path / "logs",
        name="mpi", marker="mpitest", launcher=engines.Launcher(kind="mpirun", mpi=mpi),
        device="cpu")
    group = start_group(spec, channel=collector.env())
    try:
        assert len(group.launched) == 1 and Path(group.launched[0].spec.argv[0]).name in (
            "mpirun", "mpiexec")
        messages = []
        deadline = time.monotonic() + 240
        while group.launched[0].poll() is None and time.monotonic() < deadline:
            messages.extend(collector.drain())
            time.sleep(0.2)
        code = proc.stop(group.launched[0], grace_s=5)
        time.sleep(0.2)
        messages.extend(collector.drain())
    finally:
        collector.close()
    log = (tmp_path / "logs" / "mpi.log").read_text()
    assert code == 0, log[-3000:]
    hellos = {m.hello["rank"]: m.hello for m in messages}
    assert sorted(hellos) == [0, 1], log[-3000:]
    assert {h["world_size"] for h in hellos.values()} == {2}
    assert sorted(h["local_rank"] for h in hellos.values()) == [0, 1]
    seen = [m.msg for m in messages if m.msg["type"] == "seen"]
    assert {s["requested"]["backend"] for s in seen if s["what"] == "distributed"} == {"gloo"}
    assert {s["applied"]["bucket_mb"] for s in seen if s["what"] == "ddp"} == {2.0}
    batches = {}
    for m in messages:
        if m.msg["type"] == "tick":
            batches[m.hello["rank"]] = m.msg["batches"]
    assert batches.get(0, 0) >= 12 and batches.get(1, 0) >= 12, batches
    byes = [m.msg for m in messages if m.msg["type"] == "bye"]
    assert len(byes) == 2 and all(b["exit_code"] == 0 for b in byes)
    assert "done: 12 steps" in log


def test_probe_under_mpirun_is_measured_and_leaves_nothing(mpi, tmp_path):
    """The whole trial path under mpirun: two DDP ranks probed, summed, stopped, swept."""
    from autotune.measuring.outcome import Outcome
    from autotune.measuring.trial import TrialSpec, run_trial
    from conftest import live_children, trial_processes

    r = run_trial(TrialSpec.of(
        command=(str(EXAMPLE), "--num-images", "128", "--batch-size", "8", "--epochs", "1000",
                 "--data-dir", str(tmp_path / "data")),
        instances=2, cwd=str(tmp_path), log_dir=tmp_path / "logs", name="mpiprobe",
        launcher=engines.Launcher(kind="mpirun", mpi=mpi), device="cpu", max_s=60.0,
        min_measure_s=4.0, target_rel=0.5, foreign_limit_cores=1e9))
    # no figure is compared here, so any estimate will do: the probe ends once it has one
    # (at the default 5% it measured to its limit)
    assert r.outcome == Outcome.OK, (r.reason, r.log_tail)
    assert r.source == "dataloader" and r.samples_per_s > 0
    assert r.seen.get("backend") == "gloo"
    assert trial_processes("mpiprobe") == [] and live_children() == []


@pytest.mark.parametrize("kind", ["mpirun", "local"])
def test_a_probe_whose_rank_fails_is_a_crash_with_that_rank_s_code(kind, mpi, tmp_path):
    """Rank 1 exits 5 while rank 0 lingers: mpirun would let rank 0 wait out its 10 minutes
    and fold its own signal into the code; locally we stop rank 0 ourselves. Either way the
    probe ends at once, as a crash with rank 1's code, not as our own stop."""
    from autotune.measuring.outcome import Outcome
    from autotune.measuring.trial import TrialSpec, run_trial
    from conftest import SCRIPTS, live_children, trial_processes

    name = f"fail{kind}"
    r = run_trial(TrialSpec.of(
        command=(str(SCRIPTS / "ddp_toy.py"), "--run-seconds", "4", "--exit-code", "5",
                 "--fail-rank", "1", "--linger", "600"),
        instances=2, cwd=str(tmp_path), log_dir=tmp_path / "logs", name=name,
        launcher=engines.Launcher(kind=kind, mpi=mpi if kind == "mpirun" else None),
        device="cpu", max_s=120.0, min_measure_s=120.0, hang_s=100.0, grace_s=3.0,
        foreign_limit_cores=1e9))
    assert r.outcome == Outcome.CRASHED and r.exit_code == 5, (r.reason, r.log_tail)
    assert r.reason.startswith("exited with code 5"), r.reason
    assert r.duration_s < 60, r.duration_s  # not rank 0's 600 s, nor the probe's 120 s
    assert trial_processes(name) == [] and live_children() == []
