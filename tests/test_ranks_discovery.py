"""Ranks discovered, not assumed (issue 11): one rank runs as ``python train.py`` does, N ranks
as ``torchrun --nproc_per_node N``; a two-rank probe learns whether a script trains
data-parallel; placeholders without a value and autotune options after the script are told
before anything runs."""

import json
import os

import pytest

from autotune.commands import common
from autotune.launching import rank_command
from autotune.measuring.outcome import Outcome
from autotune.tuning import baseline, space
from conftest import SCRIPTS, autotune, last_json, live_children
from probes import intercept
from test_shapes_e2e import probe, script

WHEN_LAUNCHED = str(SCRIPTS / "shape_ddp_when_launched.py")
QUIET = ["--plain", "--foreign-limit", "1000"]


# -- the environment of one rank and of N ------------------------------------------------------
def test_one_rank_gets_no_torchrun_variables_and_n_ranks_get_torchruns():
    assert rank_command.torchrun_env(rank=0, world_size=1, local_rank=0, local_world_size=1,
                                     master_addr="127.0.0.1", master_port=1234,
                                     run_id="x") == {}
    env = rank_command.torchrun_env(rank=1, world_size=2, local_rank=1, local_world_size=2,
                                    master_addr="127.0.0.1", master_port=1234, run_id="x")
    assert env == {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                   "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1234",
                   "TORCHELASTIC_RUN_ID": "x"}


def test_an_unconditional_init_at_one_rank_gets_a_world_of_one():
    alone = intercept.solo_world({"backend": "gloo"}, {})
    assert alone["RANK"] == "0" and alone["WORLD_SIZE"] == "1"
    assert alone["MASTER_ADDR"] == "127.0.0.1" and int(alone["MASTER_PORT"]) > 0
    # The call or the environment names its world: left alone.
    assert intercept.solo_world({"backend": "gloo", "rank": 0, "world_size": 2}, {}) == {}
    assert intercept.solo_world({}, {"RANK": "0", "WORLD_SIZE": "1"}) == {}
    assert intercept.solo_world({"init_method": "tcp://h:1"}, {}) == {}
    assert intercept.solo_world({"store": object()}, {}) == {}


@pytest.mark.parametrize("instances", [1, 2])
def test_a_probe_of_n_ranks_gives_what_python_or_torchrun_would(tmp_path, instances):
    out = tmp_path / "env"
    out.mkdir()
    r = probe(tmp_path, script("shape_ddp_when_launched.py", "--env-out", str(out)),
              instances=instances, max_s=20.0)
    assert r.outcome == Outcome.OK, r.reason
    seen = [json.loads(p.read_text()) for p in out.glob("env-*.json")]
    assert len(seen) == instances
    if instances == 1:
        assert all(v is None for v in seen[0].values()), seen  # as `python train.py`
        assert "backend" not in r.seen
    else:
        assert sorted(e["RANK"] for e in seen) == ["0", "1"]
        assert {e["WORLD_SIZE"] for e in seen} == {"2"} and all(e["TORCHELASTIC_RUN_ID"]
                                                                 for e in seen)
        assert r.seen["backend"] == "gloo" and r.seen["world_size"] == 2


def test_a_script_that_always_starts_a_process_group_still_runs_at_one_rank(tmp_path):
    r = probe(tmp_path, script("shape_ddp.py"), max_s=20.0)
    assert r.outcome == Outcome.OK, r.reason
    assert r.seen["backend"] == "gloo" and r.seen["world_size"] == 1
    assert any(intercept.SOLO_NOTE in n.text for n in r.notes), r.notes


# -- when a two-rank probe is needed -------------------------------------------------------------
CPU2 = space.Machine(cores=2)


@pytest.mark.parametrize("base, req, machine, why", [
    (space.Baseline(), space.SpaceRequest(), CPU2, ""),
    (space.Baseline(distributed=True), space.SpaceRequest(), CPU2, "saw torch.distributed"),
    (space.Baseline(), space.SpaceRequest(fixed={"instances": space.parse_fix(
        ["instances=1"])["instances"]}), CPU2, "--fix/--space"),
    (space.Baseline(), space.SpaceRequest(devices=2), CPU2, "a rank on each device"),
    (space.Baseline(), space.SpaceRequest(), space.Machine(cores=1), "one core"),
    (space.Baseline(), space.SpaceRequest(global_batch=33), CPU2, "odd"),
    (space.Baseline(), space.SpaceRequest(),
     space.Machine(cores=8, device="gpu", gpus=1, mps=False, mps_why="no daemon"), "MPS"),
])
def test_ranks_probe_only_when_the_baseline_cannot_tell(base, req, machine, why):
    got = baseline.ranks_unasked(machine, base, req)
    assert (got == "") if not why else (why in got), got


def test_the_alone_reason_reaches_the_space_note():
    b = space.Baseline(batch_size=32, workers=0, alone_why="a probe of 2 ranks saw them alone")
    sp = space.build(CPU2, b, space.SpaceRequest())
    assert "instances" not in sp.domains
    assert any(n.text.startswith("instances: fixed at 1: a probe of 2 ranks saw them alone")
               for n in sp.notes), sp.notes
    assert sp.ranks_why == "a probe of 2 ranks saw them alone"  # the reason, typed
    assert space.Space.from_dict(sp.to_dict()).ranks_why == sp.ranks_why


# -- placeholders and options after the script ---------------------------------------------------
def test_a_placeholder_the_script_also_sets_explicitly_is_a_usage_error():
    with pytest.raises(common.UsageError, match=r"\{workers\}.*'workers=1'"):
        common.check_placeholders(("t.py", "--x", "{workers}", "workers=1"))
    common.check_placeholders(("t.py", "--batch-size", "{batch_size}", "-j", "2"))


def test_option_after_the_script_gets_a_hint_and_the_missing_value_one_error(tmp_path):
    env = dict(os.environ, AUTOTUNE_RUNS_DIR=str(tmp_path / "runs"))
    p = autotune("tune", "--trials", "3", WHEN_LAUNCHED, "--x", "{workers}", "--baseline",
                 "workers=1", cwd=tmp_path, timeout=60, env=env)
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert lines[0].startswith("HINT: --baseline after the script went to the script")
    assert lines[1].startswith("ERROR: {workers} is a placeholder") and len(lines) == 2
    assert not (tmp_path / "runs").exists()


def test_a_placeholder_of_a_knob_a_probe_leaves_out_gets_the_scripts_default():
    assert rank_command.substitute(["--bucket", "{bucket_mb}", "-b", "{batch_size}"],
                                   {"batch_size": 8}) == ["--bucket", "25", "-b", "8"]
    with pytest.raises(ValueError, match=r"\{workers\}"):
        rank_command.substitute(["{workers}"], {})


# -- tune with defaults searches ranks -----------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name, args", [
    # nanoGPT's shape: DDP when RANK is set, nccl by default, batches built by hand (16 a step).
    # The imagenet shape (DataLoader, -b/-j) is tuned in test_tune_e2e's wrap of the bundled
    # image example and in test_frameworks.
    ("shape_nccl_default.py", ["--samples-per-step", "16"]),
])
def test_tune_with_defaults_searches_ranks_of_a_script_that_goes_ddp_when_launched(
        tmp_path, name, args):
    env = dict(os.environ, AUTOTUNE_RUNS_DIR=str(tmp_path / "runs"))
    ours = args[:2] if args[:1] == ["--samples-per-step"] else []
    # no confirmation: what is checked is the search's space and its probes (the confirmation
    # of a two-rank winner runs in test_tune_e2e's wrap of the image example)
    p = autotune("tune", *QUIET, "--json", "--trials", "4", "--seconds", "8",
                 "--confirm-rounds", "0", "--recipe-dir",
                 str(tmp_path / "recipes"), *ours, str(SCRIPTS / name), *args[len(ours):],
                 cwd=tmp_path, timeout=400, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    s = last_json(p)
    assert {"instances", "bucket_mb"} <= set(s["space"]["domains"]), s["space"]
    import optuna

    run_dir = s["run_dir"]
    from autotune.tuning import study as studies
    study = optuna.load_study(study_name=f"autotune-{os.path.basename(run_dir)}",
                              storage=studies.sqlite_url(os.path.join(run_dir, "study.db")))
    assert {"instances", "bucket_mb"} <= set().union(*(t.params for t in study.trials))
    two = [t for t in study.trials if (t.user_attrs.get("knobs") or {}).get("instances") == 2
           and t.user_attrs.get("outcome") == "ok"]
    assert two and any(t.user_attrs.get("ranks_probe") for t in two)
    if name == "shape_nccl_default.py":  # every two-rank probe was told of the switch
        from autotune.store.journal import read_events

        evs, _ = read_events(run_dir)
        two_ranks = [e["result"] for e in evs if e["event"] == "trial_finished"
                     and e["result"]["knobs"].get("instances") == 2]
        assert two_ranks and all(any("asked for backend 'nccl'" in n["text"] for n in r["notes"])
                                 for r in two_ranks)
    assert live_children() == []


@pytest.mark.slow
@pytest.mark.parametrize("name,why,probed", [
    # its source never names torch.distributed: no two-rank probe at all
    ("tune_toy.py", "its source never starts torch.distributed (tune_toy.py read", False),
    # it asks torch.distributed whether a group is up: the probe answers
    ("tune_toy_logs_rank.py", "a probe of 2 ranks (torchrun's environment) saw them train "
                              "alone", True)])
def test_ranks_training_alone_keep_instances_at_one_with_the_reason(tmp_path, name, why,
                                                                    probed):
    from autotune.store.journal import read_events

    env = dict(os.environ, AUTOTUNE_RUNS_DIR=str(tmp_path / "runs"))
    p = autotune("tune", *QUIET, "--json", "--trials", "2", "--seconds", "6",
                 "--confirm-rounds", "0", "--recipe-dir", str(tmp_path / "recipes"),
                 str(SCRIPTS / name), "--work", "1", cwd=tmp_path, timeout=300,
                 env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    s = last_json(p)
    assert "instances" not in s["space"]["domains"]
    assert any(f"instances: fixed at 1: {why}" in n for n in s["space"]["notes"]), \
        s["space"]["notes"]
    evs, _ = read_events(s["run_dir"])
    two = [e for e in evs if e["event"] == "trial_finished"
           and e["result"]["knobs"].get("instances") == 2]
    assert bool(two) == probed, [e["result"]["knobs"] for e in two]
    assert live_children() == []
