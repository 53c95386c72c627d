"""``--objective``: each config's score, the Pareto front and its pick (pure), and the search
driven by each objective against a fake probe (a real Optuna study, no processes)."""

import dataclasses
import json
import math

import pytest

from autotune import UsageError
from autotune.measuring.energy import EnergyPerSample
from autotune.measuring.noise import NoiseEstimate
from autotune.tuning import decision, goodput, objective
from autotune.tuning import study as studies
from autotune.tuning.decision import Measured
from autotune.tuning.objective import Kind, Objective, Point, Scorer
from test_study import SEEN, FakeProbe, machine, tune  # noqa: F401 - a fixture

GOODPUT = Objective.parse("goodput")
ENERGY = Objective.parse("energy")
BOTH = Objective.parse("throughput,energy")


# -- parsing --------------------------------------------------------------------------------------
def test_objectives_parse_once_into_a_typed_value():
    assert Objective.parse("throughput") == objective.THROUGHPUT
    assert Objective.parse(" Throughput , ENERGY ").kinds == (Kind.THROUGHPUT, Kind.ENERGY)
    assert BOTH.multi and BOTH.uses_energy and not BOTH.prunes and BOTH.token == \
        "throughput,energy"
    assert GOODPUT.prunes and not ENERGY.prunes and not GOODPUT.multi


@pytest.mark.parametrize("bad", ["speed", "energy,throughput", "goodput,energy", ""])
def test_an_unknown_objective_is_a_usage_error_naming_the_choices(bad):
    with pytest.raises(UsageError, match=r"--objective: must be one of throughput, goodput, "
                                         r"energy, throughput,energy, got"):
        Objective.parse(bad)


# -- scores ---------------------------------------------------------------------------------------
def test_goodput_scales_the_throughput_and_its_interval_by_the_efficiency():
    s = Scorer(GOODPUT, batch0=32, noise_scale=64.0)
    cfg = {"batch_size": 64, "instances": 2}  # a global batch of 128
    eff = goodput.efficiency(128, 32, 64.0)
    assert eff == pytest.approx(96 / 192)
    sc = s.score(200.0, 10.0, cfg)
    assert sc.value == pytest.approx(200 * eff) and sc.ci_half == pytest.approx(10 * eff)
    assert sc.efficiency == pytest.approx(eff) and sc.noise_scale == 64.0
    assert s.factor(cfg) == pytest.approx(eff)
    # the script's own batch keeps its throughput; without B_noise goodput is throughput
    assert s.score(100.0, 5.0, {"batch_size": 32}).value == pytest.approx(100.0)
    plain = Scorer(GOODPUT, batch0=32).score(200.0, 10.0, cfg)
    assert plain.value == 200.0 and plain.efficiency is None
    # throughput ignores B_noise even when one is known
    assert Scorer(objective.THROUGHPUT, 32, 64.0).score(200.0, 10.0, cfg).value == 200.0


def test_energy_scores_samples_per_joule_of_what_is_readable():
    e = EnergyPerSample(0.3, 0.2, "NVML energy counter", "RAPL package energy")
    sc = Scorer(ENERGY).score(100.0, 5.0, {}, e)
    assert sc.j_per_sample == pytest.approx(0.5) and sc.value == pytest.approx(2.0)
    assert sc.ci_half == pytest.approx(2.0 * 5.0 / 100.0)  # as wide, relatively, as samples/s
    cpu_only = dataclasses.replace(e, gpu_j=None, gpu_source="", gpu_why="no GPU in use")
    assert Scorer(ENERGY).score(100.0, 5.0, {}, cpu_only).value == pytest.approx(5.0)
    none = EnergyPerSample.from_dict({  # as the journal and the study hold it
        "gpu_j_per_sample": None, "cpu_j_per_sample": None, "gpu": "unavailable: no GPU in use",
        "cpu": "unavailable: /sys/class/powercap does not exist (no RAPL driver here)"})
    assert Scorer(ENERGY).score(100.0, 5.0, {}, none).value is None
    assert objective.energy_why(none) == ("GPU: no GPU in use; CPU package: /sys/class/powercap "
                                          "does not exist (no RAPL driver here)")
    assert "no span" in objective.energy_why(None)
    # the pair: the study gets both; without energy it cannot be told
    both = Scorer(BOTH)
    assert both.values(both.score(100.0, 5.0, {}, e)) == [100.0, pytest.approx(2.0)]
    assert both.values(both.score(100.0, 5.0, {}, none)) is None and both.failed() == [0, 0]


def test_the_noise_scale_over_the_most_steps_is_used():
    assert objective.noise_of([None, NoiseEstimate(None, reason="one rank")]) == (None, 0)
    assert objective.noise_of([NoiseEstimate(50.0, steps=10), NoiseEstimate(80.0, steps=40),
                               NoiseEstimate(-3.0, steps=99)]) == (80.0, 40)


# -- the Pareto front -----------------------------------------------------------------------------
def test_the_front_keeps_only_undominated_configs_fastest_first():
    pts = [Point("a", {}, 100, 5.0), Point("b", {}, 80, 6.0), Point("c", {}, 70, 5.5),
           Point("d", {}, 120, 2.0), Point("e", {}, 100, 4.0)]
    assert [p.name for p in objective.front(pts)] == ["d", "a", "b"]


def test_the_pick_is_the_fastest_within_ten_percent_of_the_best_samples_per_joule():
    pts = [Point("fast", {}, 200, 4.0), Point("mid", {}, 150, 9.2), Point("frugal", {}, 90, 10.0)]
    assert objective.pick(pts).name == "mid"  # 9.2 >= 0.9 x 10
    assert objective.pick(pts, within_rel=0.7).name == "fast"  # 4.0 >= 0.3 x 10
    assert objective.pick(pts, within_rel=0.0).name == "frugal"
    assert objective.pick([]) is None


def test_two_objectives_win_only_better_on_one_and_not_worse_on_the_other():
    rounds = 3
    base = [Measured(100.0, 1.0)] * rounds
    faster = [Measured(130.0, 1.0)] * rounds
    e_base = [Measured(10.0, 0.1)] * rounds
    d = decision.decide_pair({"baseline": base, "x": faster},
                             {"baseline": e_base, "x": [Measured(10.1, 0.1)] * rounds},
                             "baseline")
    assert d.winner == "x" and not d.kept_baseline and d.speedup == pytest.approx(1.3)
    assert "+30.0% samples/s" in d.reason
    # faster, but each sample costs 40% more energy: not a winner of the pair
    d = decision.decide_pair({"baseline": base, "x": faster},
                             {"baseline": e_base, "x": [Measured(6.0, 0.1)] * rounds},
                             "baseline")
    assert d.kept_baseline and d.winner == "baseline"
    # slower within the noise, clearly more frugal: wins on samples/J
    d = decision.decide_pair({"baseline": base, "x": [Measured(99.0, 1.0)] * rounds},
                             {"baseline": e_base, "x": [Measured(14.0, 0.1)] * rounds},
                             "baseline")
    assert d.winner == "x" and "samples/J beyond doubt" in d.reason


# -- the search on each objective (fake probes) ---------------------------------------------------
def bigger_is_faster(knobs):
    """Throughput grows with the batch (the trap goodput avoids)."""
    return 100.0 * (1 + knobs["batch_size"] / 32) * (1.2 if knobs["threads"] == 1 else 1.0)


class NoisyDdp(FakeProbe):
    """Data-parallel ranks that measure the gradient noise scale."""

    def __init__(self, rate, noise_scale, **kw):
        super().__init__(rate, ddp=True, **kw)
        self.noise_scale = noise_scale

    def __call__(self, spec, **kw):
        r = super().__call__(spec, **kw)
        noise = NoiseEstimate(self.noise_scale, steps=40, b_small=16, b_big=32) \
            if spec.ranks.instances > 1 else NoiseEstimate(None, reason="one rank")
        return dataclasses.replace(r, noise=noise)


def test_goodput_fixes_b_noise_from_the_two_rank_probe_and_scores_the_study(tmp_path, machine):
    fake = NoisyDdp(bigger_is_faster, noise_scale=8.0)
    report, t, run_dir = tune(tmp_path, fake, trials=8, objective="goodput",
                              space_tokens=("batch_size=8:64",), fix_tokens=("bucket_mb=25",))
    assert report.objective == "goodput"
    assert "B_noise 8 (over 40 steps), fixed for the search" in report.objective_note
    base_batch = 16  # SEEN: the script's own batch at one rank
    h = studies.open_study(studies.sqlite_url(run_dir / "study.db"),
                           f"autotune-{run_dir.name}", run_id=run_dir.name)
    scored = [t for t in h.trials() if studies.comparable(t)]
    assert len(scored) >= 4
    for tr in scored:  # each value is samples/s x the efficiency of its global batch
        k = tr.user_attrs["knobs"]
        eff = goodput.efficiency(k["batch_size"] * k.get("instances", 1), base_batch, 8.0)
        assert tr.value == pytest.approx(tr.user_attrs["samples_per_s"] * eff)
        assert tr.user_attrs["score_ci_half"] == pytest.approx(tr.user_attrs["ci_half"] * eff)
    best = report.best_score
    assert best.efficiency is not None and best.noise_scale == 8.0
    # the fastest config in samples/s (the largest batch) is not the goodput winner
    assert report.best.knobs["batch_size"] * report.best.knobs.get("instances", 1) <= 32
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["objective"] == "goodput" and summary["score"]["best"]["efficiency"]


class NoisyLater(NoisyDdp):
    """The two-rank probe of the baseline stage measures no noise scale; the search's do."""

    def __call__(self, spec, **kw):
        r = super().__call__(spec, **kw)
        return r if spec.ranks.name.startswith("trial") else dataclasses.replace(r, noise=None)


def test_goodput_measured_only_in_the_search_rescores_the_confirmation_not_the_study(
        tmp_path, machine):
    fake = NoisyLater(bigger_is_faster, noise_scale=8.0)
    report, _, run_dir = tune(tmp_path, fake, trials=8, objective="goodput",
                              space_tokens=("batch_size=8:64",), fix_tokens=("bucket_mb=25",))
    assert "measured during the search, which was steered by throughput" in \
        report.objective_note
    h = studies.open_study(studies.sqlite_url(run_dir / "study.db"),
                           f"autotune-{run_dir.name}", run_id=run_dir.name)
    for tr in (t for t in h.trials() if studies.comparable(t)):  # the study: throughput
        assert tr.value == pytest.approx(tr.user_attrs["samples_per_s"])
    # the confirmation compared goodput: the largest global batch (fastest) is not chosen
    assert report.best_score.noise_scale == 8.0
    assert report.best.knobs["batch_size"] * report.best.knobs.get("instances", 1) <= 32, \
        report.best.knobs


def test_goodput_without_a_data_parallel_trial_says_it_scored_throughput(tmp_path, machine):
    fake = FakeProbe(bigger_is_faster)  # ranks train alone: no noise scale ever
    report, _, _ = tune(tmp_path, fake, trials=4, objective="goodput", confirm_rounds=1,
                        space_tokens=("batch_size=8:64",))
    assert report.objective_note.startswith("goodput needs a data-parallel trial: scored as "
                                            "throughput")
    assert report.best_score.efficiency is None
    assert "goodput needs a data-parallel trial" in " ".join(n.text for n in report.notes)


def joules(knobs):
    """Small batches burn more per sample, one thread saves; 2 workers cost a lot."""
    return 0.5 * 32 / knobs["batch_size"] * (0.7 if knobs["threads"] == 1 else 1.0) * \
        (3.0 if knobs["workers"] == 2 else 1.0)


class Metered(FakeProbe):
    """A probe whose meter read CPU package energy (or, with ``readable=False``, none)."""

    def __init__(self, rate, j, *, readable=True, **kw):
        super().__init__(rate, **kw)
        self.j, self.readable = j, readable

    def __call__(self, spec, **kw):
        r = super().__call__(spec, **kw)
        knobs = {**SEEN, "threads": 2, **spec.ranks.knobs}
        e = EnergyPerSample(None, self.j(knobs) if self.readable else None, "",
                            "RAPL package energy" if self.readable else "",
                            gpu_why="no GPU in use", cpu_why="" if self.readable else
                            "/sys/class/powercap does not exist (no RAPL driver here)")
        return dataclasses.replace(r, energy=e)


def workers_fast(knobs):
    return 100.0 * (1 + knobs["workers"]) * (1 + knobs["batch_size"] / 1024)


def test_energy_search_maximises_samples_per_joule(tmp_path, machine):
    fake = Metered(workers_fast, joules)
    report, _, run_dir = tune(tmp_path, fake, trials=10, objective="energy",
                              space_tokens=("batch_size=16:64",), fix_tokens=("instances=1",))
    h = studies.open_study(studies.sqlite_url(run_dir / "study.db"),
                           f"autotune-{run_dir.name}", run_id=run_dir.name)
    for tr in (t for t in h.trials() if studies.comparable(t)):
        k = {**SEEN, **tr.user_attrs["knobs"]}
        threads = 1 if k.get("thread_pct") == 50 else 2
        assert tr.value == pytest.approx(1 / joules({**k, "threads": threads}))
    assert not any(e["trial"].startswith("trial") for e in journal(run_dir, "trial_pruned"))
    # the fastest (2 workers) spends 3x the energy: the winner runs without them
    assert report.best.knobs["workers"] != 2 and not report.kept_baseline
    assert report.best_score.samples_per_j > report.baseline_score.samples_per_j


def test_energy_objective_without_a_baseline_reading_stops_before_the_search(tmp_path, machine):
    fake = Metered(workers_fast, joules, readable=False)
    with pytest.raises(UsageError, match=r"--objective energy: the baseline probe read no energy "
                                         r"\(GPU: no GPU in use; CPU package: /sys/class/"
                                         r"powercap does not exist"):
        tune(tmp_path, fake, trials=6, objective="energy", fix_tokens=("instances=1",))
    assert [s.ranks.name for s in fake.specs] == ["baseline"]


def test_two_objectives_make_a_multi_objective_study_and_a_pareto_pick(tmp_path, machine):
    fake = Metered(workers_fast, joules)
    report, _, run_dir = tune(tmp_path, fake, trials=10, objective="throughput,energy",
                              confirm_rounds=1, space_tokens=("batch_size=16:64",),
                              fix_tokens=("instances=1",))
    h = studies.open_study(studies.sqlite_url(run_dir / "study.db"),
                           f"autotune-{run_dir.name}", run_id=run_dir.name, objectives=2,
                           prune=False)
    assert len(h.study.directions) == 2
    done = [t for t in h.trials() if studies.comparable(t)]
    assert len(done) >= 5 and all(len(t.values) == 2 for t in done)
    pts = list(report.pareto)
    picked = [p for p in pts if p.name == report.picked]
    assert pts and len(picked) <= 1
    assert objective.front(pts) == pts  # nothing on it dominates another
    pick = objective.pick(pts)
    assert picked == [pick] or pick.name == "baseline"
    summary = report.to_dict()["pareto"]
    assert [p["name"] for p in summary] == [p.name for p in pts]
    assert [p["picked"] for p in summary] == [p.name == report.picked for p in pts]
    from autotune.commands.tune import objective_lines, objective_parts

    lines = objective_lines(report)
    assert lines[0] == "objective: throughput,energy" and any(
        ln.startswith("Pareto front (") for ln in lines)
    assert sum(ln.startswith("  * ") for ln in lines) == len(picked)
    assert len(objective_parts(report)["front"]) == len(pts)
    ev = journal(run_dir, "pareto")[-1]
    assert ev["picked"] == pick.name and len(ev["points"]) >= len(ev["front"])
    assert not any(math.isnan(p["samples_per_j"]) for p in ev["points"])


# -- end to end, as a user runs it (real training on the CPU) ------------------------------------
import os  # noqa: E402

from conftest import SCRIPTS, assert_one_error_line, autotune, journal, last_json  # noqa: E402
from fakes.rapl import growing_powercap  # noqa: E402

TOY = str(SCRIPTS / "tune_toy.py")
# one rank, no workers: the baseline and two probes of batch size or threads
SHORT = ["--plain", "--json", "--foreign-limit", "1000", "--trials", "3", "--seconds", "6",
         "--confirm-rounds", "1", "--confirm-seconds", "5", "--space", "batch_size=8:32",
         "--fix", "workers=0", "instances=1"]


def _env(**extra):
    return {**os.environ, **extra}


def test_energy_objective_without_any_counter_is_one_error_before_anything_runs(tmp_path):
    p = autotune("tune", "--objective", "energy", "--", TOY, cwd=tmp_path, timeout=60,
                 env=_env(AUTOTUNE_RAPL_ROOT=str(tmp_path / "no-powercap"),
                          AUTOTUNE_RUNS_DIR=str(tmp_path / "runs")))
    assert_one_error_line(p, "--objective energy: no energy counter can be read here",
                          "no-powercap does not exist")
    assert not (tmp_path / "runs").exists()


def test_an_unknown_objective_is_one_error_line(tmp_path):
    p = autotune("wrap", "--objective", "watts", "--", TOY, cwd=tmp_path, timeout=60)
    assert_one_error_line(p, "--objective", "'watts'", "throughput,energy")


@pytest.mark.slow
def test_tune_for_energy_reads_the_rapl_counter_and_keeps_samples_per_joule(tmp_path):
    with growing_powercap(tmp_path / "powercap", watts=20.0) as root:
        p = autotune("tune", *SHORT, "--objective", "energy", "--recipe-dir",
                     str(tmp_path / "recipes"), "--", TOY, cwd=tmp_path, timeout=240,
                     env=_env(AUTOTUNE_RAPL_ROOT=str(root),
                              AUTOTUNE_RUNS_DIR=str(tmp_path / "runs")))
    s = last_json(p)
    assert s["objective"] == "energy"
    best, base = s["score"]["best"], s["score"]["baseline"]
    # 20 W over whatever the config trains: J/sample = 20 / (samples/s), within the meter's span
    for sc in (best, base):
        assert sc["j_per_sample"] == pytest.approx(20.0 / sc["samples_per_s"], rel=0.25)
        assert sc["value"] == pytest.approx(sc["samples_per_j"])
    shown = autotune("recipes", "show", s["recipe"], cwd=tmp_path, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "objective: energy" in shown.stdout and "J/sample" in shown.stdout


@pytest.mark.slow
def test_tune_for_throughput_and_energy_lists_and_draws_the_pareto_front(tmp_path):
    with growing_powercap(tmp_path / "powercap", watts=20.0) as root:
        p = autotune("tune", *SHORT, "--objective", "throughput,energy", "--recipe-dir",
                     str(tmp_path / "recipes"), "--", TOY, cwd=tmp_path, timeout=240,
                     env=_env(AUTOTUNE_RAPL_ROOT=str(root),
                              AUTOTUNE_RUNS_DIR=str(tmp_path / "runs")))
    s = last_json(p)
    assert s["objective"] == "throughput,energy"
    front = s["pareto"]
    assert front and all(p["samples_per_j"] > 0 for p in front)
    pts = [Point(p["name"], p["knobs"], p["samples_per_s"], p["samples_per_j"]) for p in front]
    assert objective.front(pts) == pts
    recipe = (tmp_path / "recipes").glob("*.toml").__next__().read_text()
    assert "[objective]" in recipe and 'name = "throughput,energy"' in recipe and "front" in recipe
    rep = autotune("report", s["run_dir"], cwd=tmp_path, timeout=120)
    assert rep.returncode == 0, rep.stderr
    html = (tmp_path / "runs").glob("*/report.html").__next__().read_text()
    assert "Pareto front" in html and 'data-chart="pareto"' in html
    assert html.count('class="front"') == len(front)


@pytest.mark.slow
def test_tune_for_goodput_on_a_script_that_never_trains_data_parallel_falls_back(tmp_path):
    # instances left free: the script's source never names torch.distributed
    args = [a for a in SHORT if a != "instances=1"] + ["--confirm-rounds", "0"]
    p = autotune("tune", *args, "--objective", "goodput", "--recipe-dir",
                 str(tmp_path / "recipes"), "--", TOY, cwd=tmp_path, timeout=240,
                 env=_env(AUTOTUNE_RUNS_DIR=str(tmp_path / "runs")))
    s = last_json(p)
    assert s["objective"] == "goodput"
    assert s["objective_note"].startswith("goodput needs a data-parallel trial: scored as "
                                          "throughput")
    assert "its source never starts torch.distributed" in s["objective_note"]  # why
    assert s["space"]["domains"].get("instances", [1]) == [1]
    assert "goodput needs a data-parallel trial: scored as throughput" in p.stderr
    assert s["score"]["best"]["efficiency"] is None


@pytest.mark.slow
def test_tune_for_energy_on_the_fake_gpu_host_reads_nvml_s_energy_counter(tmp_path):
    """The GPU's joules from NVML's total-energy counter (the fake grows it by the GPU's 60 W as
    NVIDIA documents); no RAPL here, so the GPU's are the only joules."""
    import subprocess
    import sys
    import tempfile
    import time
    import shutil
    from pathlib import Path

    from fakes.gpu_host import fake_gpu_env, write_nvml_config

    mps_dir = tempfile.mkdtemp(prefix="atg", dir="/tmp")  # short, as the daemon needs
    try:
        cfg = write_nvml_config(tmp_path, gpus=1, energy_mj=1000, energy_since=time.time())
        env = fake_gpu_env(cfg, mps_dir)
        env.update(FAKE_RANK_OUT=str(tmp_path), AUTOTUNE_RUNS_DIR=str(tmp_path / "runs"),
                   AUTOTUNE_RAPL_ROOT=str(tmp_path / "no-powercap"))
        p = subprocess.run(
            [sys.executable, "-m", "autotune", "tune", "--plain", "--json", "--foreign-limit",
             "1000", "--objective", "energy", "--trials", "2", "--seconds", "8",
             "--confirm-rounds", "0", "--seed", "1", "--space", "thread_pct=50:100", "--fix",
             "instances=1", "workers=0", "batch_size=8", "bucket_mb=25", "--recipe-dir",
             str(tmp_path / "recipes"), "--", str(SCRIPTS / "fake_gpu_train.py")],
            cwd=tmp_path, env=env, text=True, capture_output=True, timeout=300)
    finally:
        shutil.rmtree(mps_dir, ignore_errors=True)
    s = last_json(p)
    base = s["score"]["baseline"]
    assert base["j_per_sample"] == pytest.approx(60.0 / base["samples_per_s"], rel=0.25)
    read = [e["result"]["energy"] for e in journal(Path(s["run_dir"]), "trial_finished")
            if e["trial"] == "baseline" and e["result"]["outcome"] == "ok"][-1]
    assert read["gpu"] == "NVML energy counter" and read["cpu_j_per_sample"] is None
    assert "no-powercap does not exist" in read["cpu"]


@pytest.mark.slow
def test_tune_for_goodput_takes_b_noise_from_the_two_rank_probe_and_scores_by_it(tmp_path):
    """The two pieces together on real training: a script that goes DDP only when launched with
    WORLD_SIZE > 1 (noise_toy, held at lr 0), instances left free. The tuner's two-rank probe
    measures the noise scale through DDP's communication hook; the search fixes B_noise from it
    and scores every config by samples/s x the efficiency of its global batch against the
    script's own 16; the summary, the recipe and the journal carry that value."""
    from pathlib import Path

    from autotune.tuning import study as studies
    from test_noise import exact_noise_scale

    p = autotune("tune", "--plain", "--json", "--foreign-limit", "1000", "--trials", "3",
                 "--seconds", "16", "--confirm-rounds", "0", "--seed", "0",
                 "--objective", "goodput",
                 "--space", "batch_size=16:64", "--fix", "workers=0", "bucket_mb=25",
                 "--recipe-dir", str(tmp_path / "recipes"), "--",
                 str(SCRIPTS / "noise_toy.py"), cwd=tmp_path, timeout=240,
                 env=_env(AUTOTUNE_RUNS_DIR=str(tmp_path / "runs")))
    s = last_json(p)
    run_dir = Path(s["run_dir"])
    ranks = [e["result"] for e in journal(run_dir, "trial_finished") if e["trial"] == "ranks"]
    assert ranks and ranks[-1]["outcome"] in ("ok", "foreign-load"), ranks
    noise = ranks[-1]["noise"]
    assert (noise["ranks"], noise["b_small"], noise["b_big"]) == (2, 16, 32), noise
    # the norms are taken on one step per 50 ms at most (probes/noise.SAMPLE_GAP_S): a probe's
    # span holds up to 20 a second alone, and far fewer when a loaded machine slows
    # its steps (34 in one CI run, 56 in another): many, not a handful
    assert noise["steps"] >= 20, noise
    b_noise = noise["noise_scale"]
    truth = exact_noise_scale()
    assert truth / 2 <= b_noise <= truth * 2, (noise, truth)

    assert s["objective"] == "goodput"
    # without a confirmation the baseline's own probe still gives the summary its facts
    assert s["probes"]["baseline"] is not None and s["probes"]["baseline"]["breakdown"], s
    assert s["objective_note"].startswith(f"goodput: B_noise {b_noise:.4g} (over "
                                          f"{noise['steps']} steps), fixed for the search"), \
        (s["objective_note"], p.stderr[-3000:])
    assert "scored as throughput" not in p.stderr
    recipe = next((tmp_path / "recipes").glob("*.toml")).read_text()
    assert 'name = "goodput"' in recipe and f"noise_scale = {b_noise!r}" in recipe, recipe
    assert "needs a data-parallel trial" not in recipe
    best = journal(run_dir, "best")[-1]
    assert best["objective"] == "goodput" and best["score"]["noise_scale"] == b_noise

    base_batch = 16  # noise_toy's own --batch-size, one rank
    h = studies.open_study(studies.sqlite_url(run_dir / "study.db"),
                           f"autotune-{run_dir.name}", run_id=run_dir.name)
    # a trial of a config answered already replays that answer (``duplicate_of``): not measured
    scored = [t for t in h.trials() if studies.comparable(t) and
              "duplicate_of" not in t.user_attrs]
    batches = set()
    for tr in scored:  # each value is samples/s x the efficiency of its global batch
        k = tr.user_attrs["knobs"]
        batches.add(k["batch_size"] * k.get("instances", 1))
        eff = goodput.efficiency(k["batch_size"] * k.get("instances", 1), base_batch, b_noise)
        assert tr.value == pytest.approx(tr.user_attrs["samples_per_s"] * eff), tr
    assert any(t.user_attrs.get("ranks_probe") for t in scored)
    assert batches - {base_batch}, batches  # a config whose efficiency is not 1 was scored
    for role, sc in s["score"].items():
        k = s[role]["knobs"]
        eff = goodput.efficiency(k["batch_size"] * k.get("instances", 1), base_batch, b_noise)
        assert sc["noise_scale"] == b_noise and sc["efficiency"] == pytest.approx(eff)
        assert sc["value"] == pytest.approx(sc["samples_per_s"] * eff)
