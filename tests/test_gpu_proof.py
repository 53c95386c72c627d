"""The GPU proof kit (bench/gpu_proof.py) as CI can run it: against the fake GPU host (fake
``pynvml``, fake ``nvidia-cuda-mps-control``) and this CPU host, its GPU steps skipped with the
reason, or run with ``--allow-cpu`` to exercise them; its pure parts; the bundled CUDA example on
the CPU; and autotune's own words when MPS cannot start.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import EXAMPLES, SCRIPTS, live_children
from fakes.gpu_host import ROOT, fake_gpu_env, write_nvml_config

sys.path.insert(0, str(ROOT / "bench"))

from gpuproof import facts, measure, nvmlread, report, steps  # noqa: E402

KIT = ROOT / "bench" / "gpu_proof.py"
PROOF_RANK = str(SCRIPTS / "proof_rank.py")


# -- pure parts -----------------------------------------------------------------------------------
def test_rounds_are_interleaved_in_rotated_order():
    assert measure.rotations(3, 3) == [[0, 1, 2], [1, 2, 0], [2, 0, 1]]
    assert all(sorted(r) == [0, 1, 2] for r in measure.rotations(3, 5))


def test_the_scripts_own_steady_rate_is_read():
    text = ("epoch 1 step 20 loss 2.3 samples/s 10.0\n"
            "done: 40 steps, mean samples/s 90.5, steady samples/s 101.25 (after 20 warm-up)\n")
    assert measure.parse_rate(text) == 101.25
    assert measure.parse_rate("done: 5 steps, mean samples/s 9.0, steady samples/s n/a") is None
    assert measure.parse_rate("Traceback (most recent call last):") is None


def test_plan_uses_the_tuners_shares_else_fixed_ones():
    shares = {2: {"thread_pct": 40, "trial": "trial-3", "samples_per_s": 1.0}}
    recipe = {"path": "r.toml", "knobs": {"instances": 3, "thread_pct": 50, "batch_size": 64}}
    configs = measure.plan(instances=(2, 3, 4), mps_ok=True, time_sliced=None, shares=shares,
                           recipe=recipe)
    assert [c.key for c in configs] == ["1x100", "2xmps40", "3xmps33", "4xmps25", "4xts",
                                        "recipe-hostclock", "recipe"]
    assert configs[1].share_source == "tuner's trial-3" and configs[2].share_source.startswith(
        "fixed")
    assert configs[-1].via == "autotune-run" and configs[-1].ranks == 3 and configs[-1].mps
    without = measure.plan(instances=(2, 4), mps_ok=False, time_sliced=None, shares=shares,
                           recipe=None)
    assert [c.key for c in without] == ["1x100", "2xts", "4xts"]
    assert not any(c.mps for c in without)


def test_the_recipes_ranks_also_run_plain_with_autotunes_thread_count():
    # co-located ranks get torchrun's one thread each (issue 39): nothing to tell apart...
    plain = {"instances": 4, "thread_pct": 100, "batch_size": 64}
    assert measure.autotune_threads(plain, 16) == 1
    # ...unless the recipe's host_threads gives them more: then the same ranks run plain with it
    recipe = {"path": "r.toml", "knobs": {**plain, "host_threads": 4}}
    threads = measure.autotune_threads(recipe["knobs"], 16)
    assert threads == 4
    configs = measure.plan(instances=(4,), mps_ok=True, time_sliced=(), shares={},
                           recipe=recipe, recipe_threads=threads)
    assert [c.key for c in configs] == ["1x100", "4xmps25", "4xmps100-t4", "recipe-hostclock",
                                        "recipe"]
    assert configs[3].via == "autotune-run" and configs[3].clock == "host"
    plain_t4 = configs[2]
    assert plain_t4.via == "plain" and plain_t4.threads == 4 and plain_t4.share == 100.0
    ctx = type("Ctx", (), {"settings": type("S", (), {"gpu": 0})(),
                           "env": lambda self, **kw: dict(kw)})()
    env = measure._rank_env(ctx, plain_t4, 1, 29500, {})
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"], env["WORLD_SIZE"]) == ("4", "4", "4")
    assert measure._rank_env(ctx, configs[1], 1, 29500, {})["OMP_NUM_THREADS"] == "1"
    # one thread each (torchrun's) or one rank: nothing to tell apart
    for knobs, t in (({"instances": 4}, 1), ({"instances": 1}, 16)):
        keys = [c.key for c in measure.plan(instances=(4,), mps_ok=True, time_sliced=(),
                                            shares={}, recipe={"path": "r", "knobs": knobs},
                                            recipe_threads=t)]
        assert not any("-t" in k for k in keys)
        assert ("recipe-hostclock" in keys) == (knobs["instances"] > 1)


def test_summary_gives_medians_and_the_ratio_to_one_rank():
    configs = measure.plan(instances=(2,), mps_ok=True, time_sliced=(), shares={}, recipe=None)
    runs = [{"key": "1x100", "samples_per_s": v, "gpu": {"power_w_mean": 100.0}} for v in
            (100.0, 120.0, 110.0)]
    runs += [{"key": "2xmps50", "samples_per_s": v, "mps": {"verified": True},
              "gpu": {"power_w_mean": 150.0}} for v in (150.0, None, 170.0)]
    runs[-1]["error"] = "rank 1 exited 1"
    rows = {r["key"]: r for r in measure.summarise(configs, runs)}
    assert rows["1x100"]["median"] == 110.0 and rows["1x100"]["vs_baseline"] == 1.0
    assert rows["2xmps50"]["median"] == 160.0
    assert rows["2xmps50"]["vs_baseline"] == pytest.approx(160 / 110)
    assert rows["2xmps50"]["j_per_sample"] == pytest.approx(150 / 160)
    assert rows["2xmps50"]["failed"] == ["rank 1 exited 1"]


def test_junit_outcomes_and_messages():
    xml = """<testsuites><testsuite>
      <testcase classname="tests.test_gpu_real" name="test_a"/>
      <testcase classname="tests.test_gpu_real" name="test_b">
        <skipped message="no GPU: NVML library not found"/></testcase>
      <testcase classname="tests.test_gpu_real" name="test_c">
        <failure message="AssertionError: MPS check">tb</failure></testcase>
      <testcase classname="tests.test_gpu_real" name="test_d"><error message="boom"/></testcase>
    </testsuite></testsuites>"""
    cases = steps.parse_junit(xml)
    assert [(c["test"].split("::")[1], c["outcome"]) for c in cases] == [
        ("test_a", "passed"), ("test_b", "skipped"), ("test_c", "failed"), ("test_d", "error")]
    assert cases[1]["message"] == "no GPU: NVML library not found"


def test_shares_come_from_the_fastest_good_trial_per_rank_count():
    trials = [{"trial": "t1", "knobs": {"instances": 2, "thread_pct": 50}, "outcome": "ok",
               "samples_per_s": 10.0},
              {"trial": "t2", "knobs": {"instances": 2, "thread_pct": 75}, "outcome": "ok",
               "samples_per_s": 12.0},
              {"trial": "t3", "knobs": {"instances": 2, "thread_pct": 25}, "outcome": "oom",
               "samples_per_s": 99.0},
              {"trial": "t4", "knobs": {}, "outcome": "ok", "samples_per_s": 5.0}]
    shares = steps.shares_by_instances(trials)
    assert shares[2]["thread_pct"] == 75 and shares[2]["trial"] == "t2"
    assert shares[1]["thread_pct"] == 100


def test_a_crash_is_told_by_its_last_line_and_our_last_frame():
    out = (f'Traceback (most recent call last):\n  File "{ROOT}/autotune/cli.py", line 9, in main\n'
           '  File "/usr/lib/python3/importlib/__init__.py", line 1, in import_module\n'
           "ModuleNotFoundError: No module named 'tomli_w'\n")
    assert facts.crash_line(out) == ("ModuleNotFoundError: No module named 'tomli_w' (raised in "
                                     'File "autotune/cli.py", line 9, in main)')
    assert facts.crash_line("") == "(no output)"


def test_time_sliced_none_runs_no_rank_count_without_mps(tmp_path):
    import gpu_proof
    _, none = gpu_proof.parse_args(["--out", str(tmp_path), "--time-sliced", "none"])
    _, four = gpu_proof.parse_args(["--out", str(tmp_path), "--time-sliced", "4"])
    _, default = gpu_proof.parse_args(["--out", str(tmp_path)])
    assert (none.time_sliced, four.time_sliced, default.time_sliced) == ((), (4,), None)
    keys = [c.key for c in measure.plan(instances=(4,), mps_ok=True, time_sliced=none.time_sliced,
                                        shares={}, recipe=None)]
    assert keys == ["1x100", "4xmps25"]


def test_budget_forms():
    assert [steps.budget_s(t) for t in ("90s", "4m", "1h", "30")] == [90, 240, 3600, 30]
    with pytest.raises(ValueError, match="90s, 4m or 1h"):
        steps.budget_s("4 minutes")


def test_energy_step_reads_each_probe_s_joules_and_where_they_came_from(tmp_path):
    counter = {"gpu_j_per_sample": 0.2, "cpu_j_per_sample": 0.05, "gpu": "NVML energy counter",
               "cpu": "RAPL package energy"}
    sampled = {"gpu_j_per_sample": 0.3, "cpu_j_per_sample": None, "gpu": "NVML power, sampled",
               "cpu": "unavailable: no RAPL"}
    none = {"gpu_j_per_sample": None, "cpu_j_per_sample": None, "gpu": "unavailable: no GPU",
            "cpu": "unavailable: no RAPL"}
    assert steps.energy_j_per_sample(counter) == pytest.approx(0.25)
    assert steps.energy_j_per_sample(sampled) == 0.3
    assert steps.energy_j_per_sample(none) is None
    trials = [{"energy": e} for e in (counter, none, sampled, counter, None)]
    assert steps.energy_sources(trials) == ["NVML energy counter", "NVML power, sampled"]
    (tmp_path / "events.jsonl").write_text(
        '{"t": 1, "event": "pareto", "picked": "trial-1", "front": [], "points": []}\n'
        'not json\n'
        '{"t": 2, "event": "pareto", "picked": "trial-2", "front": [{"name": "trial-2"}], '
        '"points": []}\n')
    assert steps.pareto_event(tmp_path) == {"picked": "trial-2", "front": [{"name": "trial-2"}],
                                            "points": []}
    assert steps.pareto_event(tmp_path / "missing") is None


def test_nvml_summary_leaves_out_the_first_half():
    samples = [(t, {"util_pct": u, "mem_used_bytes": m, "power_w": p})
               for t, u, m, p in ((0.0, 0, 1, 50.0), (1.0, 10, 5, 60.0), (3.0, 80, 3, 200.0),
                                  (4.0, 90, 4, 220.0))]
    s = nvmlread.summarise(samples, 0.0, 4.0, 1000.0, 1800.0)
    assert s["util_pct_mean"] == 85 and s["power_w_mean"] == 210.0
    assert s["mem_used_bytes_max"] == 5 and s["energy_j"] == 800.0


def test_markdown_names_every_step_its_status_and_why():
    steps_ = {"env": {"name": "env", "status": "ok", "reason": "1 GPU(s)", "lines": ["a"],
                      "data": {}, "started": "x", "duration_s": 1.0},
              "tune": {"name": "tune", "status": "skipped", "reason": "no CUDA torch: ...",
                       "lines": ["skipped: no CUDA torch: ..."], "data": {}, "started": "x",
                       "duration_s": 0.0}}
    rep = report.build(steps=steps_, meta={"command": "gpu_proof.py"}, leftovers=[])
    assert rep["overall"] == "incomplete" and list(rep["steps"]) == ["env", "tune"]
    md = report.markdown(rep)
    assert "| tune | skipped | no CUDA torch: ... |" in md and "## tune: skipped" in md
    left = report.build(steps=steps_, meta={}, leftovers=[{"pid": 1, "cmdline": "x"}])
    assert left["overall"] == "failed" and "| leftovers | FAILED |" in report.markdown(left)


# -- the kit, run as a user runs it ---------------------------------------------------------------
@pytest.fixture
def fake_host(tmp_path):
    """Environment of the fake one-GPU host; its MPS directory short, as the daemon needs."""
    mps_dir = tempfile.mkdtemp(prefix="atg", dir="/tmp")
    env = fake_gpu_env(write_nvml_config(tmp_path, gpus=1), mps_dir)
    yield env
    subprocess.run(["rm", "-rf", mps_dir], check=False)


def run_kit(env, out: Path, *args, timeout=300):
    p = subprocess.run([sys.executable, str(KIT), "--out", str(out), *args], env=env,
                       cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert (out / "gpu_proof.json").exists() and (out / "gpu_proof.md").exists(), p.stderr
    rep = json.loads((out / "gpu_proof.json").read_text())
    assert rep["leftovers"] == [] and live_children() == []
    return p, rep, (out / "gpu_proof.md").read_text()


def without_fake_mps(env):
    bin_dir = str(ROOT / "tests" / "fakes" / "bin")
    return dict(env, PATH=os.pathsep.join(p for p in env["PATH"].split(os.pathsep)
                                          if p != bin_dir))


def test_fake_gpu_host_without_cuda_torch(fake_host, tmp_path):
    p, rep, md = run_kit(fake_host, tmp_path / "out")
    assert p.returncode == 0, p.stdout + p.stderr
    env = rep["steps"]["env"]
    nv = env["data"]["nvml"]
    assert nv["ok"] and nv["pynvml_fake"] and nv["driver"] == "550.54.15"
    assert [d["name"] for d in nv["devices"]] == ["NVIDIA A100-SXM4-40GB"]
    mps = env["data"]["mps"]
    assert mps["kind"] == "script" and mps["started"] and mps["servers_at_start"] == []
    assert mps["stop"]["how"] == "quit" and mps["stop"]["gone"]
    assert mps["stop"]["commands"] == ["get_server_list", "get_server_list", "quit"]
    assert env["data"]["mps_agreement"]["agree"] is True
    assert any("not NVIDIA's ELF executable" in line for line in env["lines"])
    for name in ("tests", "probe", "tune", "energy", "measure"):
        step = rep["steps"][name]
        assert step["status"] == "skipped" and step["reason"].startswith("no CUDA torch"), step
        assert f"| {name} | skipped | no CUDA torch" in md
    assert rep["overall"] == "incomplete"


def test_the_gpu_tests_are_run_and_each_outcome_recorded(tmp_path):
    """On this host (no fakes), --allow-cpu: pytest -m gpu runs; its tests skip, saying why."""
    env = dict(os.environ)
    env.pop("FAKE_PYNVML_CONFIG", None)
    p, rep, md = run_kit(env, tmp_path / "out", "--steps", "tests", "--allow-cpu")
    tests = rep["steps"]["tests"]
    assert tests["data"]["cases"] and tests["data"]["counts"]["skipped"] == len(
        tests["data"]["cases"]), tests
    assert all(c["message"].startswith("no GPU") for c in tests["data"]["cases"])
    assert tests["status"] == "incomplete" and "skipped" in tests["reason"]
    assert "--allow-cpu" in md and p.returncode == 0


@pytest.mark.slow
def test_side_by_side_against_the_fake_mps_daemon(fake_host, tmp_path):
    p, rep, md = run_kit(fake_host, tmp_path / "out", "--steps", "measure", "--allow-cpu",
                         "--script", PROOF_RANK, "--instances", "2", "--seconds", "2",
                         "--rounds", "1")
    assert p.returncode == 0, p.stdout + p.stderr
    m = rep["steps"]["measure"]
    assert m["status"] == "incomplete" and "no tuned recipe" in m["reason"]
    runs = {r["key"]: r for r in m["data"]["runs"]}
    assert set(runs) == {"1x100", "2xmps50", "2xts"}
    assert all(r["samples_per_s"] > 0 and r["exits"] in ([0], [0, 0]) and not r["error"]
               for r in runs.values()), runs
    served = runs["2xmps50"]["mps"]
    assert served["verified"] and served["clients"] == served["expected"]
    assert served["stop"]["how"] == "quit" and served["stop"]["gone"]
    assert runs["2xts"]["mps"]["without_mps"] and runs["2xts"]["mps"]["clients"] == []
    assert "| 2 ranks under MPS, 50% each | 2 |" in md


@pytest.mark.slow
def test_energy_step_tunes_for_throughput_and_energy_on_nvml_s_counter(tmp_path):
    """The energy step on the fake GPU host (its NVML energy counter grows by the GPU's 60 W,
    as NVIDIA documents; no RAPL): every probe's GPU joules come from the counter, a sample
    costs 60 W / samples/s, and the Pareto front and its pick are recorded."""
    import time

    mps_dir = tempfile.mkdtemp(prefix="atg", dir="/tmp")
    try:
        env = fake_gpu_env(write_nvml_config(tmp_path, gpus=1, energy_mj=1000,
                                             energy_since=time.time()), mps_dir)
        env["AUTOTUNE_RAPL_ROOT"] = str(tmp_path / "no-powercap")
        p, rep, md = run_kit(env, tmp_path / "out", "--steps", "energy", "--allow-cpu",
                             "--energy-budget", "60s", "--foreign-limit", "1000", "--",
                             "--width", "4", "--batch-size", "8", "--workers", "0")
    finally:
        subprocess.run(["rm", "-rf", mps_dir], check=False)
    e = rep["steps"]["energy"]
    assert e["status"] == "ok" and p.returncode == 0, (e["reason"], e["lines"])
    assert "--objective throughput,energy" in e["lines"][0]
    assert e["data"]["gpu_sources"] == ["NVML energy counter"]
    ok = [t for t in e["data"]["trials"] if t["outcome"] == "ok"]
    assert ok and all(t["energy"]["gpu_j_per_sample"] == pytest.approx(
        60.0 / t["samples_per_s"], rel=0.25) for t in ok), ok
    summary = e["data"]["summary"]
    assert summary["objective"] == "throughput,energy" and summary["pareto"]
    assert e["data"]["pareto"]["picked"] in {pt["name"] for pt in e["data"]["pareto"]["points"]}
    assert "recipes-energy" in summary["recipe"]
    assert "| energy | ok | GPU joules from NVML energy counter; Pareto front of" in md


@pytest.mark.slow
def test_no_mps_binary_says_why_and_still_measures_time_sliced(fake_host, tmp_path):
    p, rep, md = run_kit(without_fake_mps(fake_host), tmp_path / "out", "--steps", "measure",
                         "--allow-cpu", "--script", PROOF_RANK, "--instances", "2",
                         "--seconds", "3", "--rounds", "1")
    env = rep["steps"]["env"]
    assert env["data"]["mps"]["why_not"] == "nvidia-cuda-mps-control is not on PATH"
    assert env["status"] == "incomplete" and "MPS cannot start here" in env["reason"]
    agreement = env["data"]["mps_agreement"]
    assert agreement["agree"] and agreement["probe"]["names_cause"], agreement
    assert "not found on PATH" in agreement["probe"]["said"]
    m = rep["steps"]["measure"]
    assert [r["key"] for r in m["data"]["runs"]] == ["1x100", "2xts"]
    assert "co-located ranks measured time-sliced only" in m["reason"]
    assert all(r["samples_per_s"] > 0 for r in m["data"]["runs"]) and p.returncode == 0


@pytest.mark.slow
def test_daemon_that_does_not_start_is_told_and_autotune_env_disagrees(fake_host, tmp_path):
    env = dict(fake_host, FAKE_MPS_FAIL_START="1")
    p, rep, md = run_kit(env, tmp_path / "out", "--steps", "env", "--mps-start-timeout", "2")
    e = rep["steps"]["env"]
    assert not e["data"]["mps"]["started"]
    assert "no daemon came up" in e["data"]["mps"]["why_not"]
    agreement = e["data"]["mps_agreement"]
    # autotune env only looks for the binary, so it claims MPS; the kit says so
    assert not agreement["agree"] and "autotune env says MPS is available" in agreement["verdict"]
    assert agreement["probe"]["said"].startswith("ERROR: the MPS control daemon did not start")
    assert agreement["probe"]["names_cause"]


def test_a_host_without_optuna_is_told_and_autotunes_steps_skipped(tmp_path):
    """A GPU host as lent here lacks optuna (here one whose import breaks): ``autotune env``
    still starts (the command line imports only the command asked for), ``autotune probe``
    says in one line what it needs, and the kit says optuna is missing, skips probe and tune
    with that reason, and runs on."""
    shadow = tmp_path / "shadow" / "optuna"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named optuna (shadowed)')\n")
    env = dict(os.environ, PYTHONPATH=str(shadow.parent))
    env.pop("FAKE_PYNVML_CONFIG", None)
    probe = subprocess.run([sys.executable, "-m", "autotune", "probe", "train.py"], env=env,
                           cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert probe.returncode == 1 and probe.stderr.count("\n") == 1, probe.stderr
    assert probe.stderr.startswith("ERROR: autotune probe needs the Python package 'optuna' "
                                   "(ImportError: No module named optuna (shadowed))")
    p, rep, md = run_kit(env, tmp_path / "out", "--steps", "probe,tune", "--allow-cpu")
    e = rep["steps"]["env"]
    assert e["data"]["packages"]["optuna"]["ok"] is False
    assert "optuna" not in e["reason"] and e["status"] != "failed", e
    for name in ("probe", "tune"):
        step = rep["steps"][name]
        assert step["status"] == "skipped", step
        assert step["reason"].startswith("optuna is not importable here (ImportError: No module "
                                         "named optuna (shadowed))"), step
    assert p.returncode == 0 and rep["overall"] == "incomplete", rep["overall"]


# -- autotune's own words when MPS cannot start ---------------------------------------------------
def autotune(env, *args):
    return subprocess.run([sys.executable, "-m", "autotune", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=180)


def test_autotune_env_and_probe_say_the_mps_binary_is_missing(fake_host):
    env = without_fake_mps(fake_host)
    out = autotune(env, "env", "--plain")
    assert out.returncode == 0, out.stderr
    assert ("mps       no (nvidia-cuda-mps-control not found on PATH (it ships with the NVIDIA "
            "driver's compute utilities; or set AUTOTUNE_MPS_CONTROL))") in out.stdout
    probe = autotune(env, "probe", "--plain", "--modes", "full", "--seconds", "10",
                     "--instances", "2", PROOF_RANK)
    assert probe.returncode == 1
    assert ("ERROR: nvidia-cuda-mps-control not found on PATH; install the NVIDIA compute "
            "utilities or set AUTOTUNE_MPS_CONTROL") in probe.stderr


# -- the bundled CUDA example, on the CPU ---------------------------------------------------------
@pytest.mark.slow
def test_cuda_example_as_two_ranks_stops_together_and_prints_its_rate(tmp_path):
    script = EXAMPLES / "cuda_small" / "train.py"
    base = {**os.environ, "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(29900 + os.getpid() % 90)}
    args = ["--width", "4", "--batch-size", "8", "--workers", "0", "--seconds", "1",
            "--warmup-steps", "2", "--log-interval", "5"]
    procs = [subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env={**base, "RANK": str(r), "LOCAL_RANK": str(r)})
             for r in range(2)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outs]
    assert measure.parse_rate(outs[0][0]) > 0 and "on cpu" in outs[0][0]
    assert outs[1][0] == ""  # rank 1 is quiet
    bad = subprocess.run([sys.executable, str(script), "--batch-size", "0"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "--batch-size must be >= 1" in bad.stderr
