"""Scripts built on the frameworks users train with, unmodified, under ``tune`` (whose baseline
is the trial ``probe`` runs) and ``run``: the Hugging Face Trainer (transformers), PyTorch
Lightning (whose ``strategy="ddp"`` starts its own ranks) and accelerate. The real packages on
the CPU, tiny models built from configs, nothing downloaded. Batch size and workers reach them through their own flags, as
placeholders.

Each case needs its package, from the ``frameworks`` extra (CI installs it; a case is skipped
without its package):

    .venv/bin/pip install -e '.[frameworks]' && .venv/bin/python -m pytest tests/test_frameworks.py
"""

import os
from pathlib import Path

import pytest

from autotune.tuning import recipes
from autotune.store.journal import read_events
from conftest import HEAVY, SCRIPTS, autotune, last_json, live_children

QUIET = ["--plain", "--foreign-limit", "1000"]

HF_ARGS = ["--report_to", "none", "--save_strategy", "no", "--use_cpu",
           "--disable_tqdm", "true", "--logging_strategy", "no"]


def _hf(tmp_path, steps):
    return ["--output_dir", str(tmp_path / "hf-out"), *HF_ARGS, "--max_steps", str(steps)]


# name, package, script args while tuning (runs until stopped), args of the full run (ends),
# whether the script trains data-parallel under torchrun (ranks searched) or starts its own
CASES = {
    "hf_trainer": ("transformers", "fw_hf_trainer.py",
                   lambda t: _hf(t, 100_000) + ["--per_device_train_batch_size", "{batch_size}",
                                                "--dataloader_num_workers", "{workers}"],
                   lambda t: _hf(t, 30) + ["--per_device_train_batch_size", "{batch_size}",
                                           "--dataloader_num_workers", "{workers}"],
                   "searched"),
    "lightning_ddp": ("lightning", "fw_lightning.py",
                      lambda t: ["--devices", "2", "--strategy", "ddp", "--batch-size",
                                 "{batch_size}", "--workers", "{workers}"],
                      lambda t: ["--devices", "2", "--strategy", "ddp", "--batch-size",
                                 "{batch_size}", "--workers", "{workers}", "--max-epochs", "1"],
                      "own"),
    "accelerate": ("accelerate", "fw_accelerate.py",
                   lambda t: ["--batch-size", "{batch_size}", "--workers", "{workers}"],
                   lambda t: ["--batch-size", "{batch_size}", "--workers", "{workers}",
                              "--epochs", "2"],
                   "searched"),
}


# Lightning's case, the main run's slowest (258 s on a clean clone, 2026-12-03), runs with the
# heaviest tunes, beside the three workers instead of on one of them
@pytest.mark.slow
@pytest.mark.parametrize("case", [
    pytest.param(c, marks=pytest.mark.xdist_group(HEAVY)) if c == "lightning_ddp" else c
    for c in sorted(CASES)])
def test_tune_and_run_an_unmodified_framework_script(tmp_path, case):
    package, name, tune_args, run_args, ranks = CASES[case]
    pytest.importorskip(package)
    script = str(SCRIPTS / name)
    env = dict(os.environ, AUTOTUNE_RUNS_DIR=str(tmp_path / "runs"))

    # tune: ranks searched where the script trains data-parallel under torchrun
    # two trials: the baseline and the two-rank probe (or one more config, for Lightning's own
    # ranks), so the ranks' verdict and the search's first steps are seen at the least cost
    # probes of 20 s: fitted ones (no --seconds) run the baseline until tight, up to 90 s, which
    # these slow-starting frameworks reach under the suite's load; 20 s bounds the test's time
    p = autotune("tune", *QUIET, "--json", "--trials", "2", "--seconds", "20",
                 "--confirm-rounds", "0", "--recipe-dir", str(tmp_path / "recipes"), script,
                 *tune_args(tmp_path), cwd=tmp_path, timeout=400, env=env)
    s = last_json(p)
    finished = [(e["trial"], e["result"]) for e in read_events(Path(s["run_dir"]))[0]
                if e["event"] == "trial_finished"]
    # the baseline: the script as the user runs it (what `autotune probe` measures, the same
    # trial), samples counted from its DataLoader
    full = [r for t, r in finished if t == "baseline"][-1]
    assert full["outcome"] == "ok", (full["reason"], full["log_tail"])
    assert full["source"] == "dataloader" and full["samples_per_s"] > 0
    if ranks == "own":  # Lightning started its second rank itself; both are counted
        assert full["seen"]["world_size"] == 2 and full["seen"]["started_by_script"]
    # the parts of a step add up: Lightning's closure runs forward and backward inside
    # optimizer.step, and they are counted once
    shares = {k: v for k, v in full["breakdown"]["shares"].items() if k != "other"}
    assert sum(s for s, _ in shares.values()) <= 1.02 + sum(h for _, h in shares.values()), \
        shares
    domains, notes = s["space"]["domains"], s["space"]["notes"]
    assert "batch_size" in domains and "workers" in domains, s["space"]
    if ranks == "searched":
        assert "instances" in domains and "bucket_mb" in domains, s["space"]
        assert any(r["knobs"].get("instances") == 2 and r["outcome"] == "ok" and
                   r["seen"].get("world_size") == 2 for _, r in finished)
    else:
        assert "instances" not in domains
        assert any(n.startswith("instances: fixed at 1: the script starts its own") for n in
                   notes), notes
    recipe = recipes.load(next((tmp_path / "recipes").glob("*.toml")))
    assert recipe.samples_per_s > 0

    # run: the full run with the recipe, to the script's own end
    p = autotune("run", "--plain", "--recipe", str(recipe.path), script, *run_args(tmp_path),
                 cwd=tmp_path, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    runs = sorted((tmp_path / "runs").glob("*-run-*"))
    ended = [e for e in read_events(runs[-1])[0] if e["event"] == "fullrun_ended"]
    assert ended and ended[-1]["exit_code"] == 0
    assert live_children() == []
