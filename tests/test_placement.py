"""Placement is pure: ranks, devices, threads, cores and env from knobs and hardware."""

import pytest

from autotune.launching import placement
from autotune.hardware.host import Gpu
from autotune.launching.placement import plan
from probes import protocol

GPUS = [Gpu(0, "GPU-aaaa-0", "A100"), Gpu(1, "GPU-bbbb-1", "A100")]


def test_two_gpus_three_instances_at_40_percent():
    p = plan(knobs={"thread_pct": 40}, instances=3, cores=list(range(12)), gpus=GPUS)
    assert p.device == "gpu" and p.local_world_size == 6 and p.needs_mps
    assert p.common_env[protocol.ENV_BACKEND_OVERRIDE] == "gloo"
    for r, slot in enumerate(p.slots):
        gpu = GPUS[r // 3]
        assert slot.gpu == gpu
        assert slot.env["CUDA_VISIBLE_DEVICES"] == gpu.uuid  # only its own GPU...
        assert slot.env["LOCAL_RANK"] == "0"  # ...so cuda:LOCAL_RANK is that GPU
        assert slot.env[protocol.ENV_HOST_LOCAL_RANK] == str(r)
        assert slot.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"
        assert slot.threads == 1  # torchrun's rule: one each on a host of several ranks
    assert any("gloo" in n for n in p.notes)


def test_one_rank_per_gpu_is_torchrun_like():
    p = plan(knobs={}, instances=1, cores=[0, 1, 2, 3], gpus=GPUS)
    assert not p.needs_mps
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in p.slots] == ["GPU-aaaa-0,GPU-bbbb-1"] * 2
    assert all("LOCAL_RANK" not in s.env for s in p.slots)  # the real local rank stays
    assert protocol.ENV_BACKEND_OVERRIDE not in p.common_env


def test_thread_share_below_100_needs_mps_even_alone():
    p = plan(knobs={"thread_pct": 50}, instances=1, cores=[0, 1], gpus=GPUS[:1])
    assert p.needs_mps and protocol.ENV_BACKEND_OVERRIDE not in p.common_env


def test_cpu_share_gives_threads_and_optional_disjoint_pinning():
    p = plan(knobs={"thread_pct": 25, "pin": 1}, instances=2, cores=[0, 1, 2, 3, 4, 5, 6, 7])
    assert p.device == "cpu" and p.local_world_size == 2 and not p.needs_mps
    assert [s.threads for s in p.slots] == [2, 2]
    assert [s.cpus for s in p.slots] == [(0, 1), (2, 3)]
    assert [s.env[protocol.ENV_CPUS] for s in p.slots] == ["0,1", "2,3"]


def test_cpu_defaults():
    one = plan(knobs={}, instances=1, cores=[0, 1])
    assert one.threads is None  # the script's own default: that is the baseline
    two = plan(knobs={}, instances=2, cores=[0, 1, 2])
    assert two.threads == 1 and all(protocol.ENV_CPUS not in s.env for s in two.slots)
    assert plan(knobs={"threads": 3, "thread_pct": 10}, instances=1, cores=[0]).threads == 3


def test_threads_never_below_one_and_oversubscription_is_noted():
    assert placement.threads_per_rank(10, 2) == 1
    assert placement.threads_per_rank(50, 8) == 4
    p = plan(knobs={"thread_pct": 100}, instances=2, cores=[0, 1])
    assert p.threads == 2 and any("oversubscribe" in n for n in p.notes)


def test_pin_sets_wrap_when_cores_run_out():
    assert placement.pin_sets([4, 5, 6], 2, 2) == [(4, 5), (4, 6)]
    assert placement.pin_sets([], 2, 1) == [(), ()]


def test_horovod_fusion_threshold_in_bytes():
    assert placement.horovod_env({"bucket_mb": 25}) == {"HOROVOD_FUSION_THRESHOLD": "26214400"}
    assert placement.horovod_env({}) == {}
    p = plan(knobs={"bucket_mb": 0.5}, instances=2, cores=[0, 1])
    assert p.common_env["HOROVOD_FUSION_THRESHOLD"] == "524288"


@pytest.mark.parametrize("kwargs, message", [
    ({"knobs": {"thread_pct": 0}, "instances": 1}, "thread_pct"),
    ({"knobs": {"thread_pct": 150}, "instances": 1}, "thread_pct"),
    ({"knobs": {}, "instances": 0}, "instances"),
    ({"knobs": {}, "instances": 1.5}, "instances"),
    ({"knobs": {}, "instances": 1, "device": "tpu"}, "device"),
    ({"knobs": {}, "instances": 1, "device": "gpu"}, "no GPU"),
])
def test_invalid_input_names_the_invariant(kwargs, message):
    with pytest.raises(ValueError, match=message):
        plan(cores=[0, 1], **kwargs)


def test_visible_gpus_follows_cuda_visible_devices():
    three = GPUS + [Gpu(2, "GPU-cccc-2")]
    assert placement.visible_gpus(three, None) == three
    assert placement.visible_gpus(three, "2,0") == [three[2], three[0]]
    assert placement.visible_gpus(three, "GPU-bbbb") == [three[1]]
    assert placement.visible_gpus(three, "1,7,0") == [three[1]]  # CUDA stops at a bad entry
    assert placement.visible_gpus(three, "") == []



def test_one_thread_rule_for_the_space_the_recipe_and_placement():
    """6 cores at 25% is 1.5 cores: every path gives the floor, 1 thread (the space rounded
    to 2 while placement floored to 1)."""
    from autotune.hardware import fingerprint
    from autotune.tuning import recipes
    from autotune.tuning import space

    assert placement.threads_per_rank(25, 6) == 1
    sp = space.Space(domains={}, fixed={}, baseline={}, cores=6)
    assert sp.trial_knobs({"thread_pct": 25})[0]["threads"] == 1
    r = recipes.Recipe(name="r", knobs={"thread_pct": 25}, samples_per_s=1.0, ci_half=0.0,
                       baseline_samples_per_s=1.0, speedup=1.0, kept_baseline=True,
                       fingerprint=fingerprint.Fingerprint(cpu_model="x", cores=6),
                       script_path="t.py")
    assert r.run_knobs(6)[0]["threads"] == 1
    assert plan(knobs={"thread_pct": 25}, instances=1, cores=list(range(6))).threads == 1
