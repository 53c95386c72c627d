"""The search space on a GPU host: MPS-aware domains, thread_pct as the MPS share, recipes run on
either device, bucket_mb narrowed by a measured allreduce (pure, with a fake probe, and real)."""

import dataclasses
import json

import pytest

from autotune.measuring import allreduce

from autotune.launching import engines
from autotune.hardware import fingerprint
from autotune.tuning import recipes
from autotune.tuning import space
from autotune import LaunchError, UsageError
from autotune.store.journal import Journal, read_events
from autotune.tuning import Prober, TuneSettings, TuneState, load_state
from autotune.tuning import baseline as baseline_probe
from autotune.tuning.state import save
from conftest import SCRIPTS
from results import trial_result
from fakes.gpu_host import BIN, fake_pynvml, gpu_uuid, write_nvml_config

GIB = 2**30
MB = allreduce.MB
NO_MPS = "nvidia-cuda-mps-control not found on PATH"


def gpu_machine(*, mps=True, cores=8, free=40 * GIB, **over):
    return space.Machine(cores=cores, mem_available_bytes=64 * GIB, device="gpu", gpus=1,
                         gpu_mem_available_bytes=free, mps=mps, mps_why="" if mps else NO_MPS,
                         **over)


def build(machine=None, *, ranges=(), fix=(), global_batch=None, **baseline):
    base = dict(batch_size=32, workers=0, peak_rss_bytes=GIB, cuda_peak_bytes=2 * GIB,
                distributed=True)
    base.update(baseline)
    req = space.SpaceRequest(ranges=space.parse_space(ranges), fixed=space.parse_fix(fix),
                             global_batch=global_batch)
    return space.build(machine or gpu_machine(), space.Baseline(**base), req)


# -- domains ----------------------------------------------------------------------------------
def test_ddp_script_with_mps_searches_clients_and_shares():
    sp = build()
    assert sp.device == "gpu"
    assert sp.domains["instances"] == (1, 2, 3, 4)
    assert sp.domains["thread_pct"] == (25, 50, 75, 100)
    assert sp.domains["bucket_mb"] == space.knobs.BUCKET_MB
    assert sp.domains["workers"] == tuple(range(9))
    # The baseline is the script as it ran: one rank with the whole GPU.
    # The baseline is the script as it ran: one rank with the whole GPU, torch's own threads.
    assert sp.baseline == {"batch_size": 32, "workers": 0, "thread_pct": 100, "instances": 1,
                           "host_threads": 0}
    # ...and the host side of co-located ranks: their threads, their own cores (issue 39)
    assert sp.domains["host_threads"] == (0, 2, 4) and sp.domains["pin"] == (0, 1)
    assert not any(n.text.startswith(("instances", "thread_pct")) for n in sp.notes)
    assert sp.ranks_why == ""


def test_without_mps_one_rank_keeps_the_whole_gpu_and_says_why():
    sp = build(gpu_machine(mps=False))
    assert sp.fixed["instances"] == 1 and sp.fixed["thread_pct"] == 100
    assert "instances" not in sp.domains and "thread_pct" not in sp.domains
    assert "bucket_mb" not in sp.domains  # one rank: no gradient buckets to tune
    for knob in ("instances: fixed at 1", "thread_pct: fixed at 100"):
        note = next(n.text for n in sp.notes if n.text.startswith(knob))
        assert "MPS" in note and NO_MPS in note
    assert "MPS" in sp.ranks_why and NO_MPS in sp.ranks_why
    with pytest.raises(UsageError, match=f"--space asks for instances.*{NO_MPS}"):
        build(gpu_machine(mps=False), ranges=["instances=1:2"])
    with pytest.raises(UsageError, match=f"--fix asks for thread_pct.*{NO_MPS}"):
        build(gpu_machine(mps=False), fix=["thread_pct=50"])
    assert build(gpu_machine(mps=False), fix=["instances=1"]).fixed["instances"] == 1


def test_script_without_torch_distributed_gets_one_full_rank_per_gpu():
    sp = build(distributed=False)
    assert sp.fixed["instances"] == 1 and sp.fixed["thread_pct"] == 100
    assert any(n.text.startswith("instances: fixed at 1") and "torch.distributed" in n.text
               for n in sp.notes)
    assert any(n.text.startswith("thread_pct: fixed at 100") and "one rank per GPU" in n.text
               for n in sp.notes)
    forced = build(distributed=False, ranges=["instances=1:2"])
    assert forced.domains["instances"] == (1, 2)
    assert forced.domains["thread_pct"] == (25, 50, 75, 100)


def test_batch_size_bounded_by_gpu_memory():
    # 4 GiB of CUDA memory at batch 32 with 10 GiB free: at most 0.7 x 2.5 = 1.75x the batch.
    sp = build(gpu_machine(free=10 * GIB), cuda_peak_bytes=4 * GIB)
    assert sp.domains["batch_size"] == (8, 16, 32, 56)
    # Host memory does not bound a batch that lives on the GPU...
    assert max(build(peak_rss_bytes=60 * GIB).domains["batch_size"]) == 256
    # ...unless the script never used CUDA: then it is bounded as on CPU.
    cpu_bound = build(peak_rss_bytes=32 * GIB, cuda_peak_bytes=0)
    assert max(cpu_bound.domains["batch_size"]) < 64


def test_thread_pct_ranges_are_shares_on_gpus():
    assert build(ranges=["thread_pct=30:100"]).domains["thread_pct"] == (30, 50, 75, 100)
    assert build(ranges=["thread_pct=20,40"]).domains["thread_pct"] == (20, 40)
    with pytest.raises(UsageError, match="MPS share.*not a thread count"):
        build(ranges=["threads=1:4"])


def test_initial_design_tries_two_clients_at_half_the_gpu():
    sp = build()
    design = sp.initial_design()
    assert design[:len(sp.one_at_a_time())] == sp.one_at_a_time()
    shared = {**sp.baseline, "instances": 2, "thread_pct": 50, "bucket_mb": 25, "pin": 0}
    assert shared in design
    assert build(gpu_machine(mps=False)).initial_design() == \
        build(gpu_machine(mps=False)).one_at_a_time()


# -- what the ranks get -----------------------------------------------------------------------
def test_trial_knobs_keep_the_mps_share_on_gpus():
    sp = build()
    knobs, instances = sp.trial_knobs({**sp.baseline, "instances": 2, "thread_pct": 50,
                                       "bucket_mb": 8})
    assert knobs == {"batch_size": 32, "workers": 0, "thread_pct": 50, "instances": 2,
                     "bucket_mb": 8}
    assert instances == 2
    cpu = space.Space.from_dict({**sp.to_dict(), "device": "cpu"})
    assert cpu.trial_knobs({"thread_pct": 50})[0] == {"threads": 4}


def test_space_round_trip_keeps_the_device():
    sp = build()
    assert space.Space.from_dict(json.loads(json.dumps(sp.to_dict()))) == sp
    old = {k: v for k, v in sp.to_dict().items() if k != "device"}  # a tune.json from before
    assert space.Space.from_dict(old).device == "cpu"


def recipe(gpu_count):
    fp = fingerprint.Fingerprint(cpu_model="x", cores=8, gpu_count=gpu_count,
                                 gpu_names=("NVIDIA A100-SXM4-40GB",) * gpu_count)
    return recipes.Recipe(name="r", knobs={"batch_size": 64, "thread_pct": 25, "instances": 4},
                          samples_per_s=1.0, ci_half=0.0, baseline_samples_per_s=1.0,
                          speedup=1.0, kept_baseline=False, fingerprint=fp, script_path="t.py")


def test_recipe_knobs_follow_where_it_was_tuned_and_where_it_runs():
    tuned_on_gpu = recipe(gpu_count=1)
    assert tuned_on_gpu.run_knobs(8) == ({"batch_size": 64, "thread_pct": 25,
                                          "instances": 4}, 4)
    assert tuned_on_gpu.run_knobs(8, gpus=2)[0]["thread_pct"] == 25
    # On a host without GPUs the share falls back to its CPU meaning: a quarter of the cores.
    assert tuned_on_gpu.run_knobs(8, gpus=0) == ({"batch_size": 64, "threads": 2,
                                                  "instances": 4}, 4)
    # A CPU recipe keeps its CPU meaning on a GPU host.
    assert recipe(gpu_count=0).run_knobs(8, gpus=2)[0] == {"batch_size": 64, "threads": 2,
                                                           "instances": 4}


# -- reading the machine ----------------------------------------------------------------------
def test_machine_sees_two_fake_gpus_and_mps(monkeypatch, tmp_path):
    config = write_nvml_config(tmp_path, gpus=2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("AUTOTUNE_MPS_CONTROL", str(BIN / "nvidia-cuda-mps-control"))
    with fake_pynvml(monkeypatch, config):
        m = fingerprint.machine()
        assert (m.device, m.gpus, m.mps, m.mps_why) == ("gpu", 2, True, "")
        assert m.gpu_mem_available_bytes == 38 * GIB  # the fuller GPU (2 GiB used) bounds it
        assert m.cores == fingerprint.cores()
        one = fingerprint.machine({"CUDA_VISIBLE_DEVICES": gpu_uuid(0), "PATH": ""})
        assert one.gpus == 1 and one.gpu_mem_available_bytes == 39 * GIB
        assert not one.mps and "nvidia-cuda-mps-control not found" in one.mps_why
        assert fingerprint.machine({"CUDA_VISIBLE_DEVICES": ""}).device == "cpu"


def test_a_global_batch_is_divided_by_the_visible_gpus_only(monkeypatch, tmp_path):
    """8 GPUs on the host, 2 visible: the tuner's machine, the fingerprint and the full run's
    per-rank batch all count 2 (the run divided by all 8: a batch 4x too small)."""
    from autotune.commands import run as run_command
    from autotune.launching import engines

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("AUTOTUNE_MPS_CONTROL", str(BIN / "nvidia-cuda-mps-control"))
    with fake_pynvml(monkeypatch, write_nvml_config(tmp_path, gpus=8)):
        fp = fingerprint.current(("t.py",))
        assert fp.gpu_count == fingerprint.machine().gpus == 2
        r = recipes.Recipe(name="r", knobs={"batch_size": 32, "instances": 1},
                           samples_per_s=1.0, ci_half=0.0, baseline_samples_per_s=1.0,
                           speedup=1.0, kept_baseline=False, fingerprint=fp, script_path="t.py",
                           global_batch=64)
        knobs, instances = run_command.rank_knobs(r, fp, engines.Launcher())
        assert knobs["batch_size"] == 32 and instances == 1


def test_the_allreduce_timing_counts_the_visible_gpus_only(monkeypatch, tmp_path):
    """4 GPUs, 1 visible: two allreduce ranks go on CPU (asking for 2 GPUs failed to start)."""
    from autotune.launching import group

    asked = []

    def start(spec, **kw):
        asked.append(spec)
        raise RuntimeError("not started in this test")

    monkeypatch.setattr(group, "start_group", start)
    with fake_pynvml(monkeypatch, write_nvml_config(tmp_path, gpus=4)):
        with pytest.raises(RuntimeError, match="not started"):
            allreduce.measure(ranks=2, log_dir=tmp_path, env={"CUDA_VISIBLE_DEVICES": "0"})
    assert (asked[0].device, asked[0].instances, asked[0].gpus) == ("cpu", 2, None)


def test_machine_without_a_driver_is_a_cpu(monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOTUNE_MPS_CONTROL", str(BIN / "nvidia-cuda-mps-control"))
    for config in (None, write_nvml_config(tmp_path, driver="not_loaded")):
        with fake_pynvml(monkeypatch, config):
            m = fingerprint.machine()
            assert (m.device, m.gpus, m.gpu_mem_available_bytes, m.mps) == ("cpu", 0, 0, False)
            assert m.cores == fingerprint.cores() and m.mem_available_bytes > 0


# -- bucket_mb from a measured allreduce ------------------------------------------------------
def synthetic(busbw_by_size):
    return allreduce.AllreduceResult("gloo", 2, "cpu", tuple(
        allreduce.Point(b, b / (bw * 1e9), bw, bw) for b, bw in busbw_by_size))


SATURATES_AT_4MB = synthetic([(64 * 1024, 0.1), (MB, 0.6), (4 * MB, 0.95), (16 * MB, 1.0),
                              (64 * MB, 0.9)])


def test_bucket_candidates_are_the_powers_of_two_in_the_measured_range():
    bounds = allreduce.bucket_range(SATURATES_AT_4MB)
    assert bounds == (1.0, 16.0)
    assert space.bucket_candidates(*bounds, 25) == (1, 2, 4, 8, 16, 25)
    assert space.bucket_candidates(4.0, 256.0, 25) == (4, 8, 16, 25, 32, 64, 128, 256)
    assert space.bucket_candidates(0.25, 2.0, 8) == (1, 2, 8)
    for machine in (gpu_machine(bucket_mb_range=bounds),
                    space.Machine(cores=2, bucket_mb_range=bounds)):
        assert build(machine).domains["bucket_mb"] == (1, 2, 4, 8, 16, 25)
        assert build(machine, bucket_mb=10).domains["bucket_mb"] == (1, 2, 4, 8, 10, 16)
    # The user's own range wins over the measured one.
    assert build(gpu_machine(bucket_mb_range=bounds),
                 ranges=["bucket_mb=32:128"]).domains["bucket_mb"] == (32, 64, 128)


SEEN_DDP = {"batch_size": 16, "workers": 0, "backend": "gloo"}


def baseline_result(spec):
    return trial_result(spec, seen=dict(SEEN_DDP))


def stage(tmp_path, monkeypatch, *, machine=None, run_trial=None, **settings):
    """The baseline stage's prober and state (settings as ``tune.json`` holds them); its
    probes faked."""
    monkeypatch.setattr(fingerprint, "machine", lambda: machine or space.Machine(cores=2))
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    s = TuneSettings.from_dict({"command": ["train.py"], "cwd": str(tmp_path), "seconds": 10.0,
                                **settings})
    prober = Prober(run_dir, Journal(run_dir), engines.Launcher(),
                    run_trial=run_trial or (lambda spec, **kw: baseline_result(spec)))
    return prober, TuneState.new(s, run_dir)


def fake_measure(monkeypatch, answer):
    calls = []

    def measure(**kw):
        calls.append(kw)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(baseline_probe.allreduce, "measure", measure)
    return calls


def allreduce_events(run_dir):
    return [e for e in read_events(run_dir)[0] if e["event"] == "allreduce"]


def test_baseline_step_narrows_bucket_mb_once(tmp_path, monkeypatch):
    calls = fake_measure(monkeypatch, SATURATES_AT_4MB)
    prober, st = stage(tmp_path, monkeypatch)
    b = baseline_probe.measure(prober, st)
    assert b.space.domains["bucket_mb"] == (1, 2, 4, 8, 16, 25)
    assert len(calls) == 1 and calls[0]["ranks"] == 2 and calls[0]["device"] == "cpu"
    assert calls[0]["max_bytes"] <= 64 * MB and calls[0]["launcher"] is prober.launcher
    [event] = allreduce_events(prober.run_dir)
    assert event["candidates"] == [1, 2, 4, 8, 16, 25]
    assert event["result"]["bucket_mb_range"] == [1.0, 16.0]
    assert any(n.text.startswith("bucket_mb: allreduce on 2 gloo ranks") and
               "1 to 16 MB" in n.text for n in b.learned.notes)
    # Kept with the run: a resumed baseline step does not time it again.
    save(prober.run_dir, b)
    saved = json.loads((prober.run_dir / "tune.json").read_text())
    assert saved["allreduce"]["result"]["backend"] == "gloo"
    again = baseline_probe.measure(prober, dataclasses.replace(load_state(prober.run_dir),
                                                               space=None, baseline=None))
    assert len(calls) == 1 and again.space.domains["bucket_mb"] == (1, 2, 4, 8, 16, 25)


def test_a_failed_allreduce_keeps_the_usual_candidates(tmp_path, monkeypatch):
    fake_measure(monkeypatch, LaunchError("the allreduce probe failed (exit codes [1, 1]); "
                                          "see logs/allreduce.log:\nboom"))
    prober, st = stage(tmp_path, monkeypatch)
    b = baseline_probe.measure(prober, st)
    assert b.space.domains["bucket_mb"] == space.knobs.BUCKET_MB
    assert "exit codes [1, 1]" in allreduce_events(prober.run_dir)[0]["error"]
    assert any(n.text.startswith("bucket_mb: not narrowed by a measurement: the allreduce "
                                 "probe failed (exit codes [1, 1]); see logs/allreduce.log; "
                                 "searching") for n in b.learned.notes)


@pytest.mark.parametrize("settings", [{"space_tokens": ["bucket_mb=8:32"]},
                                      {"fix_tokens": ["bucket_mb=8"]},
                                      {"fix_tokens": ["instances=1"]}])
def test_no_allreduce_when_bucket_mb_is_given_or_moot(tmp_path, monkeypatch, settings):
    calls = fake_measure(monkeypatch, SATURATES_AT_4MB)
    prober, st = stage(tmp_path, monkeypatch, **settings)
    b = baseline_probe.measure(prober, st)
    assert calls == [] and allreduce_events(prober.run_dir) == []
    assert b.allreduce is None


@pytest.mark.slow
def test_real_allreduce_narrows_bucket_mb_for_a_ddp_script(tmp_path, monkeypatch):
    """Two real gloo ranks time allreduce after a real baseline probe of a DDP script."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    s = TuneSettings(command=(str(SCRIPTS / "shape_ddp.py"),), cwd=str(tmp_path), seconds=10.0,
                     foreign_limit_cores=1e9)
    b = baseline_probe.measure(Prober(run_dir, Journal(run_dir), engines.Launcher()),
                               TuneState.new(s, run_dir))
    sp = b.space
    assert sp.domains["instances"] == (1, 2)
    result = b.allreduce.result
    assert result.backend == "gloo" and result.world_size == 2
    assert [p.bytes for p in result.points][-1] == 64 * MB
    assert sp.domains["bucket_mb"] == space.bucket_candidates(*allreduce.bucket_range(result), 25)
    assert allreduce_events(run_dir)[0]["candidates"] == list(sp.domains["bucket_mb"])


def test_the_full_runs_devices_divide_a_global_batch():
    """Probes measure one GPU's worth; the full run uses every visible GPU of every host, so a
    global batch is split over instances x GPUs x hosts."""
    two_hosts = engines.Launcher(kind="mpirun", hosts=(engines.Host("a"), engines.Host("b")),
                                   mpi=engines.MpiInfo("/x/mpirun", "mpich", "4"))
    gpu = space.Machine(cores=8, device="gpu", gpus=2)
    assert baseline_probe.job_devices(two_hosts, gpu) == 4
    assert baseline_probe.job_devices(engines.Launcher(), gpu) == 2
    cpu = space.Machine(cores=8)
    assert baseline_probe.job_devices(two_hosts, cpu) == 2
    assert baseline_probe.job_devices(engines.Launcher(), cpu) == 1


def test_first_moves_on_a_gpu_add_ranks_before_they_cut_a_lone_ranks_share():
    # Compute binds (thread_pct, batch_size, instances): on a GPU one rank's share below 100%
    # only slows it, and more ranks under MPS is the move (an H200 spent one of three probes
    # on a lone rank at 25%, which ran 21% slower).
    sp = build()
    moves = sp.one_at_a_time(("thread_pct", "batch_size", "instances"))
    assert moves[0] == {**sp.baseline, "instances": 4, "bucket_mb": 25, "pin": 0}
    assert not any(m["thread_pct"] != 100 and m["instances"] == 1 for m in moves)
    assert [m["batch_size"] for m in moves[1:3]] == [64, 16]  # the larger neighbour first
    # The share still comes with more ranks (two clients at half the GPU).
    assert {**sp.baseline, "instances": 2, "thread_pct": 50, "bucket_mb": 25, "pin": 0} in \
        sp.initial_design(("thread_pct", "batch_size", "instances"))
    # A data wait is still named first; the rank count keeps its place after it otherwise.
    assert sp.one_at_a_time(("workers", "batch_size"))[0]["workers"] == 8
    # Where the rank count is not searched, a lone rank's share is the only MPS move left.
    fixed = build(fix=["instances=1"], ranges=["thread_pct=25:100"])
    assert fixed.one_at_a_time(("thread_pct",))[0] == {**fixed.baseline, "thread_pct": 25}
    # On the CPU nothing changes: threads first when compute binds.
    cpu = build(space.Machine(cores=8, mem_available_bytes=64 * GIB, device="cpu"))
    assert cpu.one_at_a_time(("thread_pct",))[0] == {**cpu.baseline, "thread_pct": 13}
