"""The search space: parsing the user's ranges, default candidates from the machine, the rules."""

import pytest

from autotune.tuning import space
from autotune import UsageError

GIB = 2**30


def build(cores=2, mem=16 * GIB, *, ranges=(), fix=(), global_batch=None, placeholders=(),
          devices=1, **baseline):
    base = dict(batch_size=32, workers=0, peak_rss_bytes=GIB // 2)
    base.update(baseline)
    req = space.SpaceRequest(ranges=space.parse_space(ranges), fixed=space.parse_fix(fix),
                             global_batch=global_batch, placeholders=tuple(placeholders),
                             devices=devices)
    return space.build(space.Machine(cores=cores, mem_available_bytes=mem),
                       space.Baseline(**base), req)


# -- parsing ----------------------------------------------------------------------------------
def test_parse_ranges_and_lists():
    r = space.parse_space(["batch_size=16:512 workers=0:4", "threads=1,2"])
    assert (r["batch_size"].low, r["batch_size"].high) == (16, 512)
    assert r["workers"].low == 0 and r["workers"].high == 4
    assert r["thread_pct"].alias == "threads" and r["thread_pct"].values == (1, 2)


@pytest.mark.parametrize("token, words", [
    ("batchsize=1:2", ["unknown knob 'batchsize'", "batchsize=1:2"]),
    ("batch_size=512:16", ["low <= high", "512 > 16"]),
    ("batch_size=abc", ["'abc'", "not a whole number"]),
    ("workers=-1:2", ["workers must be >= 0", "-1"]),
    ("batch_size=0:4", ["batch_size must be >= 1"]),
    ("thread_pct=10:150", ["thread_pct must be <= 100"]),
    ("train.py", ["'train.py' is not NAME=LOW:HIGH", "'--'"]),
])
def test_bad_space_is_one_line_naming_the_token(token, words):
    with pytest.raises(UsageError) as e:
        space.parse_space([token])
    text = str(e.value)
    assert "\n" not in text and text.startswith("--space: ")
    for w in words:
        assert w in text
    assert e.value.exit_code == 2


def test_knob_given_twice():
    with pytest.raises(UsageError, match="given twice"):
        space.parse_space(["workers=0:2", "workers=1:3"])


@pytest.mark.parametrize("token", ["workers=1:2", "workers=1,2", "workers", "speed=3"])
def test_bad_fix(token):
    with pytest.raises(UsageError, match="^--fix: "):
        space.parse_fix([token])


@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("10m", 600),
                                           ("1h30m", 5400), ("2.5s", 2.5)])
def test_durations(text, seconds):
    assert space.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "x", "10q", "m", "0", "5m10"])
def test_bad_durations(text):
    with pytest.raises(UsageError, match="--budget"):
        space.parse_duration(text)


# -- candidates -------------------------------------------------------------------------------
def test_geometric_and_linear():
    assert space.geometric(16, 512) == (16, 32, 64, 128, 256, 512)
    assert space.geometric(24, 100) == (24, 32, 64, 100)
    assert space.linear(0, 4) == (0, 1, 2, 3, 4)
    assert space.linear(1, 64) == (1, 2, 4, 8, 16, 32, 64)
    assert space.divisors(12) == (1, 2, 3, 4, 6, 12)


def test_thread_share_round_trip():
    for cores in (1, 2, 3, 8, 64):
        for t in range(1, cores + 1):
            assert space.threads_per_rank(space.pct_for_threads(t, cores), cores) == t
    assert space.threads_per_rank(1, 8) == 1  # never zero


def test_default_space_on_two_cores():
    sp = build()
    assert sp.domains["batch_size"] == (8, 16, 32, 64, 128, 256)
    assert sp.domains["workers"] == (0, 1, 2)
    assert sp.domains["thread_pct"] == (50, 100)
    assert "instances" not in sp.domains and sp.fixed["instances"] == 1
    assert "bucket_mb" not in sp.domains and "bucket_mb" not in sp.fixed
    assert sp.baseline == {"batch_size": 32, "workers": 0, "thread_pct": 100, "instances": 1}
    assert any("instances: fixed at 1" in n.text and "torch.distributed" in n.text for n in sp.notes)
    assert sp.size() == 6 * 3 * 2


def test_input_pipeline_knobs_are_searched_where_the_script_s_loader_has_workers():
    sp = build(workers=2, prefetch=2, persistent=0)
    assert sp.domains["prefetch"] == (2, 4, 8) and sp.domains["persistent"] == (0, 1)
    assert sp.baseline["prefetch"] == 2 and sp.baseline["persistent"] == 0
    # without workers neither has an effect: such configs hold neither, and count once
    assert all("prefetch" not in c and "persistent" not in c
               for c in sp.configs() if c["workers"] == 0)
    assert sp.size() == 6 * 2 * (1 + 2 * 3 * 2)
    assert "prefetch" not in build().domains  # a workers=0 script: --space adds them
    asked = build(ranges=["prefetch=2:8 persistent=0:1"])
    assert asked.domains["prefetch"] == (2, 4, 8) and asked.domains["persistent"] == (0, 1)
    with pytest.raises(UsageError, match="cannot tune prefetch: the script builds no "
                                         "DataLoader"):
        build(ranges=["prefetch=2:8"], batch_size=None, workers=None,
              placeholders=["batch_size"])
    assert "pin_memory" not in sp.domains  # CPU: nothing to pin for


def test_defaults_follow_the_machine():
    sp = build(cores=16, workers=4)
    assert sp.domains["workers"] == tuple(range(9))
    assert sp.domains["thread_pct"] == tuple(space.pct_for_threads(t, 16) for t in (1, 2, 4, 8, 16))


def test_batch_size_capped_by_memory():
    # 1 GiB at batch 32 with 4 GiB free: at most ~0.7 * 4 = 2.8x the baseline batch.
    sp = build(mem=4 * GIB, peak_rss_bytes=GIB)
    assert max(sp.domains["batch_size"]) <= 32 * 2.8
    assert 32 in sp.domains["batch_size"]


def test_odd_baseline_values_are_candidates():
    sp = build(batch_size=100, workers=3)
    assert 100 in sp.domains["batch_size"] and 3 in sp.domains["workers"]


def test_user_ranges_and_fixes():
    sp = build(ranges=["batch_size=16:64", "threads=1:2"], fix=["workers=2"])
    assert sp.domains["batch_size"] == (16, 32, 64)
    assert sp.domains["thread_pct"] == (50, 100)
    assert sp.fixed["workers"] == 2 and "workers" not in sp.domains
    cfg = sp.config({"batch_size": 64, "thread_pct": 50})
    knobs, instances = sp.trial_knobs(cfg)
    assert knobs == {"batch_size": 64, "workers": 2, "threads": 1, "instances": 1}
    assert instances == 1


def test_space_and_fix_on_one_knob_conflict():
    with pytest.raises(UsageError, match="both in --space and in --fix"):
        build(ranges=["workers=0:2"], fix=["workers=1"])


def test_no_dataloader_drops_loader_knobs():
    sp = build(batch_size=None, workers=None)
    assert "batch_size" not in sp.domains and "workers" not in sp.domains
    assert any(n.text.startswith("batch_size: not tuned") for n in sp.notes)
    with pytest.raises(UsageError, match="cannot tune batch_size"):
        build(batch_size=None, ranges=["batch_size=8:16"])


def test_instances_searched_only_for_distributed_scripts():
    sp = build(distributed=True)
    assert sp.domains["instances"] == (1, 2)
    assert sp.domains["bucket_mb"] == space.knobs.BUCKET_MB
    # bucket_mb has no effect on one rank: configs that differ only there are one config
    one = sp.config({"batch_size": 32, "workers": 0, "thread_pct": 100, "instances": 1,
                     "bucket_mb": 5})
    other = sp.config({**one, "bucket_mb": 50})
    assert "bucket_mb" not in one and sp.key(one) == sp.key(other)
    two = sp.config({**one, "instances": 2, "bucket_mb": 5})
    assert two["bucket_mb"] == 5
    # The user may insist on more ranks for a script that did not look distributed.
    forced = build(ranges=["instances=1:2"])
    assert forced.domains["instances"] == (1, 2)


def test_a_script_that_starts_its_own_ranks_keeps_one_instance():
    seen = {"batch_size": 32, "workers": 0, "backend": "gloo", "started_by_script": "spawn"}
    base = space.Baseline.from_seen(seen)
    assert base.distributed and base.own_ranks
    sp = space.build(space.Machine(cores=4, mem_available_bytes=16 * GIB), base,
                     space.SpaceRequest())
    assert sp.fixed.get("instances") == 1 and "instances" not in sp.domains
    assert any("starts its own data-parallel ranks" in n.text for n in sp.notes)
    # Its ranks' DDP buckets are searched: the job has more than one rank.
    assert "bucket_mb" in sp.domains and sp.baseline["bucket_mb"] == 25
    assert sp.config({**sp.baseline, "bucket_mb": 5})["bucket_mb"] == 5
    assert space.Space.from_dict(sp.to_dict()) == sp
    # Hogwild-style children without torch.distributed are no ranks of a job: nothing to fix.
    assert not space.Baseline.from_seen({**seen, "backend": None}).own_ranks
    # The user may still ask for more.
    forced = space.build(space.Machine(cores=4, mem_available_bytes=16 * GIB), base,
                         space.SpaceRequest(ranges=space.parse_space(["instances=1:2"])))
    assert forced.domains["instances"] == (1, 2)


def _in_allocation(ranks_per_node, cores=4, *, ranges=(), fix=(), device="cpu", gpus=0):
    machine = space.Machine(cores=cores, mem_available_bytes=16 * GIB, nodes=2,
                            ranks_per_node=ranks_per_node, device=device, gpus=gpus,
                            mps=device == "gpu")
    req = space.SpaceRequest(ranges=space.parse_space(ranges), fixed=space.parse_fix(fix),
                             devices=2)
    return space.build(machine, space.Baseline(batch_size=32, workers=0, distributed=True), req)


def test_configs_a_node_of_the_allocation_cannot_start_are_left_out_with_the_reason():
    """Inside a Slurm allocation srun starts no more ranks on a node than it holds: 4 CPUs
    per node but --ntasks-per-node 2 keeps instances 1 and 2 of the default 1..4."""
    sp = _in_allocation(2)
    assert sp.domains["instances"] == (1, 2)
    note, = [n.text for n in sp.notes if n.text.startswith("instances:")]
    assert "3, 4 left out" in note and "at most 2 ranks" in note and "srun refuses" in note
    assert all(cfg.get("instances", 1) <= 2 for cfg in sp.configs())
    # what the user asks for too
    asked = _in_allocation(2, ranges=["instances=1:4"])
    assert asked.domains["instances"] == (1, 2)
    # one left: held there, and the space says why
    one = _in_allocation(1, ranges=["instances=1:4"])
    assert one.fixed["instances"] == 1 and "at most 1 rank " in one.ranks_why
    # outside an allocation ranks may oversubscribe: nothing is left out
    assert _in_allocation(None, ranges=["instances=1:4"]).domains["instances"] == (1, 2, 3, 4)


def test_a_node_of_one_cpu_holds_instances_at_one_and_says_why():
    """The bed's allocation (sbatch -N 2 on nodes of one CPU): a data-parallel script's ranks
    per node cannot be searched, and the space says so rather than holding it silently."""
    sp = _in_allocation(1, cores=1)
    assert "instances" not in sp.domains and sp.fixed["instances"] == 1
    assert "at most 1 rank " in sp.ranks_why and "srun refuses" in sp.ranks_why
    assert any(n.text.startswith("instances: fixed at 1: a node of the Slurm allocation")
               for n in sp.notes)
    alone = _in_allocation(None, cores=1)  # one core, no allocation: may be forced
    assert "1 core" in alone.ranks_why and "instances" not in alone.domains
    assert "--space instances=1:N" in " ".join(n.text for n in alone.notes)


def test_on_gpus_an_allocation_s_ranks_per_node_are_shared_by_its_gpus():
    sp = _in_allocation(4, device="gpu", gpus=2)
    assert sp.domains["instances"] == (1, 2)  # 2 ranks per GPU x 2 GPUs = 4 per node


def test_what_cannot_fit_the_allocation_is_a_usage_error():
    with pytest.raises(UsageError, match="--fix instances=2 does not fit: a node of the Slurm "
                                         "allocation starts at most 1 rank"):
        _in_allocation(1, fix=["instances=2"])
    with pytest.raises(UsageError, match="none of 2, 3 fits"):
        _in_allocation(1, ranges=["instances=2:3"])


def test_global_batch_keeps_only_divisors():
    sp = build(cores=4, distributed=True, global_batch=96)
    assert "batch_size" not in sp.domains
    assert sp.domains["instances"] == (1, 2, 3, 4)
    assert sp.config({**sp.baseline, "instances": 3})["batch_size"] == 32
    sp = build(cores=4, distributed=True, global_batch=10)
    assert sp.domains["instances"] == (1, 2)
    assert sp.baseline["batch_size"] == 10
    with pytest.raises(UsageError, match="drop batch_size"):
        build(global_batch=64, ranges=["batch_size=8:16"])
    with pytest.raises(UsageError, match="not divisible"):
        build(global_batch=9, fix=["instances=2"])


def test_global_batch_is_shared_by_every_device_of_the_full_run():
    """Two hosts (or GPUs): the world is instances x 2, and so is the divisor of the batch."""
    sp = build(cores=4, distributed=True, global_batch=96, devices=2)
    assert sp.domains["instances"] == (1, 2, 3, 4)
    assert sp.baseline["batch_size"] == 48
    assert sp.config({**sp.baseline, "instances": 3})["batch_size"] == 16
    assert "bucket_mb" in sp.domains  # one rank per device still has a world of 2
    assert space.Space.from_dict(sp.to_dict()) == sp
    sp = build(cores=4, distributed=True, global_batch=12, devices=4)
    assert sp.domains["instances"] == (1, 3) and sp.baseline["batch_size"] == 3
    assert sp.config({**sp.baseline, "instances": 3})["batch_size"] == 1
    with pytest.raises(UsageError, match="instances=2 x 2 devices"):
        build(global_batch=6, fix=["instances=2"], devices=2)


def test_placeholders_get_conventional_baseline():
    sp = build(batch_size=None, workers=None, placeholders=("batch_size", "workers"))
    assert sp.baseline["batch_size"] == 32 and sp.baseline["workers"] == 0
    assert "batch_size" in sp.domains and "workers" in sp.domains


def test_explicit_flags_are_fixed_not_searched():
    fixed, notes = space.explicit_fixes(["--batch-size", "64", "-j", "3"], {}, {})
    assert fixed["batch_size"].values == (64,) and fixed["workers"].values == (3,)
    assert "--batch-size {batch_size}" in notes[0]
    with pytest.raises(UsageError, match=r"'--batch-size=64'.*'--batch-size=\{batch_size\}'"):
        space.explicit_fixes(["--batch-size=64"], space.parse_space(["batch_size=8:16"]), {})
    fixed, _ = space.explicit_fixes(["--batch-size", "{batch_size}"], {}, {})
    assert "batch_size" not in fixed


def test_a_knob_the_baseline_did_not_see_held_by_an_explicit_flag_is_the_baseline_s_too():
    """nanoGPT's `--batch_size=12` with no DataLoader: the batch is fixed at 12, and the
    baseline, which ran with it, holds 12 as well (it held the conventional 32, so a probe of
    the script's own config counted as another config, and the confirmation raced the
    script's config against itself). A batch the baseline saw stays the baseline's."""
    sp = build(batch_size=None, workers=None, fix=["batch_size=12"])
    assert sp.fixed["batch_size"] == 12 and sp.baseline["batch_size"] == 12
    cfg = sp.config({"thread_pct": 100})
    assert sp.key(cfg) == sp.key(sp.baseline)
    seen = build(batch_size=32, fix=["batch_size=64"])
    assert seen.baseline["batch_size"] == 32 and seen.fixed["batch_size"] == 64


def test_index_and_choice_round_trip():
    sp = build()
    assert sp.index("batch_size", 64) == 3
    assert sp.index("batch_size", 70) == 3  # nearest candidate
    choice = sp.choice_from_config({"batch_size": 128, "workers": 2, "thread_pct": 50})
    assert choice == {"batch_size": 4, "workers": 2, "thread_pct": 0}


def test_dict_round_trip():
    sp = build(distributed=True, ranges=["workers=0:1"])
    assert space.Space.from_dict(sp.to_dict()) == sp


def test_one_at_a_time_moves_the_batch_to_its_neighbours_and_each_other_knob_to_its_far_end():
    sp = build()  # baseline batch 32 of 8..256, workers 0 of 0..2, thread_pct 100 of 50,100
    assert sp.domains["batch_size"] == (8, 16, 32, 64, 128, 256)
    moves = sp.one_at_a_time()
    # the larger neighbour first: if it pays, the search holds the smaller back
    assert moves == [{**sp.baseline, "batch_size": 64}, {**sp.baseline, "batch_size": 16},
                     {**sp.baseline, "workers": 2}, {**sp.baseline, "thread_pct": 50}]
    # at the domain's end, the one neighbour there is
    low = build(ranges=["batch_size=32:128"])
    assert [m["batch_size"] for m in low.one_at_a_time() if m["batch_size"] != 32] == [64]


@pytest.mark.parametrize("line, then", [
    ({32: 100.0, 16: 120.0, 64: 90.0}, 8),  # smaller paid off: one step further down
    ({32: 100.0, 16: 90.0, 64: 120.0}, 128),  # larger paid off: one step further up
    ({32: 100.0, 16: 120.0, 64: 90.0, 8: 130.0}, None),  # 8 is the domain's end
    ({32: 100.0, 16: 120.0, 64: 90.0, 8: 110.0}, None),  # 8 measured and no better: stop
    ({32: 100.0, 16: 102.0, 64: 90.0}, None),  # +2%: within the minimum gain
    ({32: 100.0, 16: None, 64: 125.0, 128: 140.0}, 256),  # keeps walking while it pays
    ({32: 100.0, 16: 90.0, 64: None}, None),  # the larger failed (OOM): not past it
    ({16: 120.0}, None),  # the script's own batch not measured: nothing to beat
])
def test_the_batch_walks_on_the_way_it_paid_off(line, then):
    sp = build()
    nxt = sp.batch_walk(line, min_gain_rel=0.03)
    assert (nxt and nxt["batch_size"]) == then
    if nxt:
        assert nxt == {**sp.baseline, "batch_size": then}


# minGPT's shape by the script's own clock (docs/runs/2026-11-26.md): 32 -> 32.0, 64 -> 42.5, and the
# grid's 128 -> 52, 256 -> 56.7. t(b) = b / rate fitted through 32 and 64 predicts 50.9 and 56.4.
@pytest.mark.parametrize("line, blocked, then", [
    ({32: 32.0, 16: 24.0, 64: 42.5}, (), 256),  # the gain goes on: the walk jumps to where it ends
    ({32: 32.0, 16: 24.0, 64: 42.5}, (256,), 128),  # ...never onto a batch an OOM rules out
    ({32: 100.0, 16: 95.0, 64: 104.0}, (), 128),  # +4%: the model sees ~3% more: one step
    ({32: 100.0, 16: 120.0, 64: 90.0}, (), 8),  # smaller paid off: no fixed part explains it
    ({32: 32.0, 64: 42.5, 256: None}, (), 128),  # the far end ran out of memory: back one step
    ({32: 32.0, 64: 42.5, 256: 40.0}, (), 128),  # the far end fell short: the step between
])
def test_the_batch_walk_jumps_where_the_step_time_model_says_the_gain_ends(line, blocked, then):
    sp = build()  # batch 8..256, the script's 32
    nxt = sp.batch_walk(line, min_gain_rel=0.03, rates=True, blocked=lambda b: b in blocked)
    assert nxt == {**sp.baseline, "batch_size": then}
    # the same line scored in anything but samples/s walks one step at a time
    one = sp.batch_walk(line, min_gain_rel=0.03, rates=False)
    assert one is None or abs(sp.index("batch_size", one["batch_size"])
                              - sp.index("batch_size", max((b for b in line if line[b]),
                                                           key=lambda b: line[b]))) == 1


# nanoGPT's shape, run F's 6m tune (docs/runs/2026-11-27.md): 12 read 136.9 (two processes' mean),
# 8 144.5, 16 136.7, and the walk down to 4 fell; the grid read 16 at 1.09x, 32-96 at 1.15-1.18x.
@pytest.mark.parametrize("line, blocked, then", [
    ({12: 136.9, 8: 144.5, 16: 136.7}, (), 64),  # flat: halfway from 16 to the largest, 96
    ({12: 136.9, 8: 144.5, 16: 136.7, 4: 120.0}, (), 64),  # the walk's probes change nothing
    ({12: 136.9, 8: 144.5, 16: 136.7}, (64,), 32),  # only 32 fits beside the confirmation
    ({12: 136.9, 8: 144.5, 16: 136.7}, (32,), None),  # nothing past the neighbour fits
    ({12: 100.0, 8: 120.0, 16: 100.0, 4: 90.0}, (), None),  # the smaller paid clearly: no look
    ({12: 100.0, 8: 100.0, 16: 90.0}, (), None),  # the larger neighbour fell
    ({12: 100.0, 8: 99.0, 16: None}, (), None),  # ...or ran out of memory
    ({12: 100.0, 16: 101.0}, (), None),  # the smaller neighbour not answered yet
    ({12: 100.0, 8: 99.0, 16: 101.0, 96: 98.0}, (), None),  # once: a batch past 16 was seen
    ({8: 99.0, 16: 101.0}, (), None),  # the script's own batch not measured
])
def test_a_flat_batch_line_looks_once_halfway_to_the_largest_batch(line, blocked, then):
    sp = build(batch_size=12)  # batch 3..96
    assert sp.domains["batch_size"] == (3, 4, 8, 12, 16, 32, 64, 96)
    far = sp.batch_far(line, min_gain_rel=0.03, blocked=lambda b: b in blocked)
    assert (far and far["batch_size"]) == then
    if far:
        assert far == {**sp.baseline, "batch_size": then}


def test_the_step_time_model_fits_a_fixed_part_and_a_part_per_sample():
    from autotune.tuning.space.build import jump_along

    # t(b) = 0.5 + 0.01 b exactly: rates at 10, 20 and 40 give back the same model
    rates = {b: b / (0.5 + 0.01 * b) for b in (10, 20, 40)}
    # predicted 61.5, 76.2, 86.5 and 92.8 samples/s: the nearest within the gain of the best
    assert jump_along(rates, [80, 160, 320, 640], 0.03) == 640
    assert jump_along(rates, [80, 160, 320, 640], 0.10) == 320  # 640 adds 7%: within 10%
    assert jump_along(rates, [80, 160, 320, 640], 0.25) == 160
    assert jump_along({10: 50.0}, [20, 40], 0.03) is None  # one point: no model
    assert jump_along({10: 50.0, 20: 40.0}, [40], 0.03) is None  # no fixed part


def test_the_first_moves_follow_what_binds_the_baseline():
    from autotune.measuring.breakdown import Breakdown

    sp = build()
    stalled = Breakdown({"data": (0.34, 0.02), "forward": (0.5, 0.02), "backward": (0.1, 0.01),
                         "comm": (0.0, 0.0), "optimizer": (0.02, 0.0), "other": (0.04, 0.01)}, 1)
    assert stalled.binding_group() == "compute" and stalled.moves()[:2] == ("workers",
                                                                            "batch_size")
    design = sp.initial_design(stalled.moves())
    assert design[0] == {**sp.baseline, "workers": 2}  # the data wait first, then compute's
    assert sorted(map(str, design)) == sorted(map(str, sp.initial_design()))  # same set
    compute = Breakdown({"data": (0.01, 0.0), "forward": (0.7, 0.02), "backward": (0.25, 0.01),
                         "comm": (0.0, 0.0), "optimizer": (0.02, 0.0), "other": (0.02, 0.0)}, 1)
    assert sp.initial_design(compute.moves())[0] == {**sp.baseline, "thread_pct": 50}


def test_initial_design_adds_a_core_balanced_config():
    sp = build()  # 2 cores: one worker and one thread fill them
    design = sp.initial_design()
    assert design[:4] == sp.one_at_a_time()
    assert design[4] == {**sp.baseline, "workers": 1, "thread_pct": 50}
    assert space.Space.from_dict(sp.to_dict()).initial_design() == design
    big = build(cores=16, workers=0)
    assert {**big.baseline, "workers": 8, "thread_pct": 50} in big.initial_design()
    assert build(cores=2, fix=["workers=0"]).initial_design() == \
        build(cores=2, fix=["workers=0"]).one_at_a_time()


def test_ranks_a_framework_starts_itself_count_in_the_global_batch():
    """Lightning's ``Trainer(devices=2, strategy="ddp")``: the script starts its second rank
    itself, so the job's batch is twice the per-rank one, and a larger per-rank batch says so."""
    seen = {"batch_size": 32, "workers": 0, "backend": "gloo", "world_size": 2,
            "started_by_script": "subprocess"}
    base = space.Baseline.from_seen(seen)
    assert base.own_ranks and base.own_world == 2
    assert space.Baseline.from_seen({**seen, "started_by_script": None}).own_world == 0
    sp = space.build(space.Machine(cores=4, mem_available_bytes=16 * GIB), base,
                     space.SpaceRequest())
    assert sp.own_world == 2 and sp.world_devices == 2
    assert space.Space.from_dict(sp.to_dict()) == sp
    assert sp.job_batch(sp.baseline) == 64
    bigger = {**sp.baseline, "batch_size": 256}
    assert not sp.keeps_batch(bigger) and sp.keeps_batch(dict(sp.baseline))
    note = sp.batch_note(bigger)
    assert "a global batch of 512 (batch_size 256 x 2 ranks, 2 started by the script itself)" \
        in note and "8x the script's own 64" in note and "--global-batch 64" in note
    # a space from before the count: one rank, as it was
    old = sp.to_dict()
    del old["own_world"]
    assert space.Space.from_dict(old).job_batch(sp.baseline) == 32

@pytest.mark.parametrize("runner_value, kept", [(65.0, ["baseline", "trial-2"]),
                                                (104.0, ["baseline", "trial-2", "trial-1"])])
def test_a_runner_up_that_keeps_the_batch_is_confirmed_under_a_budget_only_above_the_baseline(
        runner_value, kept):
    """word_lm as it comes: batch 32 read +5%, and the runner-up, a thread cut that keeps the
    script's batch, 0.65x. As the batch-keeping alternative it took a third of every round and
    made the search keep ~225 s of 5m for it, stopping at 71 s; the baseline is the better
    alternative. One measured above the baseline stays."""
    from autotune.measuring.outcome import Outcome
    from autotune.tuning import confirm_entries, objective
    from autotune.tuning.records import Known

    sp = build()  # the script's batch 32, thread_pct 100
    cfgs = {0: {}, 1: {"thread_pct": 50}, 2: {"batch_size": 64}}
    values = {0: 100.0, 1: runner_value, 2: 105.0}
    known = {}
    for n, c in cfgs.items():
        cfg = sp.config({**sp.baseline, **c})
        known[sp.key(cfg)] = Known(n, Outcome.OK, values[n], 2.0, cfg)
    scorer = objective.Scorer(objective.Objective())
    full = [("baseline", sp.baseline), ("trial-2", sp.config({**sp.baseline, **cfgs[2]})),
            ("trial-1", sp.config({**sp.baseline, **cfgs[1]}))]
    assert [n for n, _ in confirm_entries.essential(sp, full, known=known, scorer=scorer)] == kept
    assert [n for n, _ in confirm_entries.essential(sp, full)] == ["baseline", "trial-2", "trial-1"]



@pytest.mark.parametrize("entries, kept", [
    # the best changes the batch, the runner-up keeps it: the batch-keeping alternative stays
    ([("baseline", {}), ("best", {"batch_size": 64}), ("runner", {"workers": 2})],
     ["baseline", "best", "runner"]),
    # both change the batch and nothing measured keeps it: the runner-up is no alternative
    ([("baseline", {}), ("best", {"batch_size": 64}), ("runner", {"batch_size": 16})],
     ["baseline", "best"]),
    # the best keeps the batch: the runner-up is left out
    ([("baseline", {}), ("best", {"workers": 2}), ("runner", {"batch_size": 64})],
     ["baseline", "best"]),
    # neither of the two keeps it and a third does: that one stays, the runner-up goes
    ([("baseline", {}), ("best", {"batch_size": 64}), ("runner", {"batch_size": 16}),
      ("keeper", {"workers": 2})], ["baseline", "best", "keeper"]),
    ([("baseline", {}), ("best", {"batch_size": 64})], ["baseline", "best"]),
])
def test_a_budget_confirms_the_best_and_only_a_batch_keeping_alternative_beside_it(entries,
                                                                                   kept):
    from autotune.tuning import confirm_entries

    sp = build()
    full = [(n, sp.config({**sp.baseline, **c})) for n, c in entries]
    assert [n for n, _ in confirm_entries.essential(sp, full)] == kept


@pytest.mark.parametrize("keeper_value, confirmed", [(90.0, False), (105.0, True)])
def test_a_batch_keeping_alternative_is_confirmed_only_if_it_beat_the_baseline(keeper_value,
                                                                               confirmed):
    """word_lm's shape: the best two change the batch, and the one config that keeps it (a
    thread cut) measured 0.6x the baseline; confirming it beside the winner in every round
    only widened the winner's interval. One measured above the baseline is confirmed."""
    from autotune.measuring.outcome import Outcome
    from autotune.tuning import confirm_entries, objective
    from autotune.tuning.records import Known

    sp = build()  # the script's batch 32, thread_pct 100
    cfgs = {0: {}, 1: {"batch_size": 64}, 2: {"batch_size": 16}, 3: {"thread_pct": 50}}
    values = {0: 100.0, 1: 130.0, 2: 110.0, 3: keeper_value}
    known = {}
    for n, c in cfgs.items():
        cfg = sp.config({**sp.baseline, **c})
        known[sp.key(cfg)] = Known(n, Outcome.OK, values[n], 2.0, cfg)
    entries = confirm_entries.candidates(sp, known, objective.Scorer(objective.Objective()))
    names = [n for n, _ in entries]
    assert names[:3] == ["baseline", "trial-1", "trial-2"]
    assert ("trial-3" in names) is confirmed
