"""The host side of GPU ranks (issue 39): co-located ranks get torchrun's thread rule (one thread
each unless the user sets their own), their threads and disjoint cores are knobs the search may
move, and a recipe carries them to the full run. Pure, against the fake GPUs' shapes."""

import pytest

from autotune.hardware.host import Gpu
from autotune.launching import placement, rank_command
from autotune.tuning import recipes, space
from probes import protocol
from test_recipes import FP, recipe

GPU = (Gpu(0, "GPU-aaaa-0", "H200"),)
CORES = list(range(16))


def test_colocated_gpu_ranks_get_one_thread_each_as_under_torchrun():
    p = placement.plan(knobs={"thread_pct": 25}, instances=4, cores=CORES, gpus=GPU)
    assert [s.threads for s in p.slots] == [1, 1, 1, 1] and p.threads_by_rule
    assert placement.rank_threads(p, {}, rank_command.THREAD_VARS) == 1
    # the user's own variable stands, as torchrun leaves it
    assert placement.rank_threads(p, {"OMP_NUM_THREADS": "3"}, rank_command.THREAD_VARS) is None
    # one rank alone: torch's own threads, as `python train.py` gets
    alone = placement.plan(knobs={}, instances=1, cores=CORES, gpus=GPU)
    assert alone.slots[0].threads is None
    assert placement.rank_threads(alone, {}, rank_command.THREAD_VARS) is None


def test_a_host_threads_knob_wins_over_the_rule_and_the_users_variable():
    knobs, instances = space.rank_knobs({"instances": 4, "thread_pct": 25, "host_threads": 4},
                                        cores=16, device="gpu")
    assert knobs["threads"] == 4 and knobs["thread_pct"] == 25 and "host_threads" not in knobs
    p = placement.plan(knobs=knobs, instances=instances, cores=CORES, gpus=GPU)
    assert p.threads == 4 and not p.threads_by_rule
    assert placement.rank_threads(p, {"OMP_NUM_THREADS": "3"}, rank_command.THREAD_VARS) == 4
    # 0 is the rule: no thread count is given
    rule, _ = space.rank_knobs({"instances": 4, "host_threads": 0}, cores=16, device="gpu")
    assert "threads" not in rule
    # on the CPU the share of cores rules; a GPU recipe's host_threads does not apply
    cpu, _ = space.rank_knobs({"instances": 2, "thread_pct": 50, "host_threads": 4}, cores=16,
                              device="cpu")
    assert cpu["threads"] == 8


def test_pinned_gpu_ranks_get_disjoint_even_shares_of_the_cores():
    p = placement.plan(knobs={"thread_pct": 25, "pin": 1}, instances=4, cores=CORES, gpus=GPU)
    sets = [s.cpus for s in p.slots]
    assert sets == [tuple(range(4 * r, 4 * r + 4)) for r in range(4)]  # its loader's too
    assert [s.env[protocol.ENV_CPUS] for s in p.slots] == \
        [",".join(map(str, c)) for c in sets]
    assert p.threads == 1  # the cores are the rank's; its threads are still the rule's
    unpinned = placement.plan(knobs={"thread_pct": 25}, instances=4, cores=CORES, gpus=GPU)
    assert all(not s.cpus and protocol.ENV_CPUS not in s.env for s in unpinned.slots)


def _machine(**over):
    return space.Machine(**{"cores": 16, "mem_available_bytes": 64 * 2**30, "device": "gpu",
                            "gpus": 1, "gpu_mem_available_bytes": 40 * 2**30, "mps": True,
                            **over})


def _build(machine, **baseline):
    base = dict(batch_size=32, workers=4, peak_rss_bytes=2**30, cuda_peak_bytes=2**31,
                distributed=True)
    base.update(baseline)
    return space.build(machine, space.Baseline(**base), space.SpaceRequest())


def test_the_gpu_search_moves_host_threads_and_pin_where_ranks_may_share_a_gpu():
    sp = _build(_machine())
    assert sp.domains["host_threads"] == (0, 2, 4) and sp.domains["pin"] == (0, 1)
    assert sp.baseline["host_threads"] == 0 and "pin" not in sp.baseline  # one rank: no pin
    shared = sp.config({**sp.baseline, "instances": 4, "pin": 1})
    knobs, instances = sp.trial_knobs(shared)
    assert knobs["pin"] == 1 and instances == 4 and "threads" not in knobs
    # a rank alone (no MPS, or a script that is not distributed): nothing to move
    for sp in (_build(_machine(mps=False)), _build(_machine(), distributed=False)):
        assert "host_threads" not in sp.domains and "pin" not in sp.domains
    # a host of 4 cores: at most 4 threads a rank, and pinning still fits
    assert _build(_machine(cores=2)).domains["host_threads"] == (0, 2)
    assert "pin" not in _build(_machine(cores=1)).domains
    # on the CPU the knobs are not searched (thread_pct and instances are the host side there)
    cpu = space.build(space.Machine(cores=8), space.Baseline(batch_size=32, workers=0,
                                                             distributed=True),
                      space.SpaceRequest())
    assert "host_threads" not in cpu.domains and "pin" not in cpu.domains


def test_a_recipe_carries_host_threads_and_pin_to_the_run(tmp_path):
    knobs = {"batch_size": 64, "workers": 4, "thread_pct": 25, "instances": 4,
             "host_threads": 2, "pin": 1}
    gpu_fp = FP.__class__(**{**FP.to_dict(), "gpu_count": 1, "gpu_names": ("H200",)}) \
        if hasattr(FP, "to_dict") else FP
    path = recipes.save(recipe(name="host-side", knobs=knobs, fingerprint=gpu_fp),
                        tmp_path / "recipes")
    loaded = recipes.load(path)
    assert dict(loaded.knobs) == knobs
    run, instances = loaded.run_knobs(16, 1)
    assert run["threads"] == 2 and run["pin"] == 1 and instances == 4
    assert space.knobs_text(loaded.knobs).endswith("host_threads=2 pin=1")


@pytest.mark.parametrize("token", ["host_threads=0:4", "pin=0:1"])
def test_the_knobs_can_be_given_in_space(token):
    sp = space.build(_machine(), space.Baseline(batch_size=32, workers=4, distributed=True),
                     space.SpaceRequest(ranges=space.parse_space([token])))
    name = token.split("=")[0]
    assert sp.domains[name][0] == 0 and sp.domains[name][-1] in (1, 4)
