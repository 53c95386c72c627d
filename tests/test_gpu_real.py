"""On a real NVIDIA GPU (skipped elsewhere): NVML, and two ranks sharing GPU 0 through a real MPS
daemon, verified as its clients, on gloo, the daemon gone afterwards."""

import json
import os
import time
from pathlib import Path

import pytest

from autotune.hardware import mps, nvml
from autotune.hardware import proc
from autotune.launching.group import RanksSpec, start_group

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def _gpu_or_skip():
    ok, why = nvml.available()
    if not ok:
        pytest.skip(f"no GPU: {why}")


pytestmark = pytest.mark.gpu


def test_nvml_lists_real_devices():
    _gpu_or_skip()
    devices = nvml.devices()
    assert devices and all(d.uuid and d.uuid.startswith(("GPU-", "MIG-")) for d in devices)
    assert nvml.driver_version()
    assert {"index", "util_pct", "mem_used_bytes"} <= set(nvml.sample()[0])


def test_two_ranks_share_gpu0_through_real_mps(tmp_path):
    _gpu_or_skip()
    ok, why = mps.available()
    if not ok:
        pytest.skip(f"no MPS: {why}")
    env = dict(os.environ, CUDA_RANK_OUT=str(tmp_path), CUDA_RANK_EPOCHS="200")
    spec = RanksSpec(command=(str(SCRIPTS / "cuda_rank.py"),), instances=2, gpus=1,
                     knobs={"thread_pct": 50}, device="gpu", cwd=str(tmp_path),
                     log_dir=tmp_path / "logs", name="cuda", marker="cudatest", env=env,
                     mps_verify_s=120)
    group = start_group(spec, channel={})
    try:
        check = group.wait_mps_check(timeout_s=150)
        assert check is not None and check.ok, check
        deadline = time.monotonic() + 300
        while group.running() and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        codes = [proc.stop(lp, grace_s=10) for lp in group.launched]
    assert codes == [0, 0], (tmp_path / "logs" / "cuda.log").read_text()[-2000:]
    recs = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]
    assert {r["backend"] for r in recs} == {"gloo"} and {r["sum"] for r in recs} == {2.0}
    assert recs[0]["CUDA_VISIBLE_DEVICES"] == recs[1]["CUDA_VISIBLE_DEVICES"]
    daemon = group.mps
    mps.stop_shared()
    assert not daemon.running()


def test_the_step_clock_chooses_its_timing_on_a_real_gpu():
    """The step clock's calibration on real CUDA events (issue 39): it chooses within its first
    steps, says what and why, and its sums stay each part's time: the device's for the choice of
    events (scaled from sampled steps), the host's otherwise."""
    _gpu_or_skip()
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    from probes.parts import CALIBRATE_STEPS, CUDA, HOST, StepClock

    torch.zeros(1, device="cuda")
    clock = StepClock()
    x = torch.randn(512, 512, device="cuda", requires_grad=True)
    t0 = time.monotonic()
    for _ in range(CALIBRATE_STEPS + 40):
        clock.data(time.monotonic(), time.monotonic())
        loss = (x @ x).sum()
        clock.backward_begin()
        loss.backward()
        clock.backward_end()
        clock.optimizer_begin()
        with torch.no_grad():
            x -= 1e-6 * x.grad
        clock.optimizer_end()
    torch.cuda.synchronize()
    wall = time.monotonic() - t0
    snap = clock.snapshot()
    assert clock.choice.startswith("step clock:"), clock.choice
    assert clock.clock == (CUDA if clock.events else HOST)
    assert 0 < sum(snap.values()) <= 1.5 * wall, (snap, wall, clock.choice)
