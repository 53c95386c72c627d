"""``autotune wrap`` on the fake 2-GPU host, through the command line as a user runs it.

The study searches the GPU meaning of the knobs: ``instances`` MPS clients per GPU and
``thread_pct`` as each client's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (never turned into threads).
Probes measure one GPU's worth; the full run spreads the winner over both GPUs. One MPS daemon
serves the whole run and is stopped at its end.
"""

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import SCRIPTS, last_json, live_children
from fakes.gpu_host import fake_gpu_env, gpu_uuid, write_nvml_config

TRAIN = str(SCRIPTS / "fake_gpu_train.py")
pytestmark = pytest.mark.slow


def test_wrap_searches_mps_clients_and_share_then_runs_on_every_gpu(tmp_path):
    mps_dir = tempfile.mkdtemp(prefix="atg", dir="/tmp")  # short, as the daemon needs
    try:
        out = tmp_path / "ranks"
        out.mkdir()
        env = fake_gpu_env(write_nvml_config(tmp_path, gpus=2), mps_dir)
        env.update(FAKE_RANK_OUT=str(out), AUTOTUNE_RUNS_DIR=str(tmp_path / "runs"))
        p = subprocess.run(
            [sys.executable, "-m", "autotune", "wrap", "--plain", "--json", "--foreign-limit",
             "1000", "--trials", "4", "--seconds", "8", "--confirm-rounds", "1",
             "--confirm-seconds", "5", "--seed", "1",
             "--space", "instances=1:2", "thread_pct=50:100", "--fix", "workers=0",
             "batch_size=8", "bucket_mb=25", "--recipe-dir", str(tmp_path / "recipes"), "--",
             TRAIN, "--run-seconds", "4"],
            cwd=tmp_path, env=env, text=True, capture_output=True, timeout=500)
        summary = last_json(p)
        space = summary["space"]
        assert space["device"] == "gpu"
        assert set(space["domains"]) == {"instances", "thread_pct"}, space
        assert space["domains"]["thread_pct"] == [50, 75, 100]

        records = [json.loads(f.read_text()) for f in out.glob("*.json")]
        probes = [r for r in records if not r["AUTOTUNE_TRIAL"].startswith("fullrun-")]
        full = [r for r in records if r["AUTOTUNE_TRIAL"].startswith("fullrun-")]
        # Probes: one GPU's worth. Shares reach the ranks as the MPS percentage, not threads.
        assert {r["CUDA_VISIBLE_DEVICES"].split(",")[0] for r in probes} == {gpu_uuid(0)}
        shares = {r["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] for r in probes}
        assert shares - {None} and shares - {None} <= {"50", "75", "100"}, shares
        shared = [r for r in probes if r["WORLD_SIZE"] == "2"]
        assert shared and all(r["mps_client"] and r["LOCAL_RANK"] == "0" for r in shared)
        # The full run: the recipe's knobs on both GPUs.
        best = summary["best"]["knobs"]
        per_gpu = best.get("instances", 1)
        assert len(full) == 2 * per_gpu, (best, full)
        assert {r["WORLD_SIZE"] for r in full} == {str(2 * per_gpu)}
        devices = sorted(r["CUDA_VISIBLE_DEVICES"] for r in full)
        if per_gpu > 1:  # each rank sees its own GPU, block by block
            assert devices == sorted([gpu_uuid(0)] * per_gpu + [gpu_uuid(1)] * per_gpu)
        else:  # one rank per GPU: each sees both, LOCAL_RANK picks its own, as under torchrun
            assert sorted(r["LOCAL_RANK"] for r in full) == ["0", "1"]
        pct = best.get("thread_pct", 100)
        if pct < 100 or per_gpu > 1:
            assert all(r["mps_client"] for r in full)
            assert {r["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] for r in full} == {f"{pct:g}"}
        assert p.stdout.count("fake_gpu_train: rank") == 2 * per_gpu

        logs = list(Path(mps_dir).glob("atmps-*/log/control.log"))
        assert len(logs) == 1, logs  # one daemon for the whole run
        log = logs[0].read_text()
        assert re.findall(r"Cmd:(.*)", log)[-1] == "quit" and log.rstrip().endswith("Exit")
        assert live_children() == []
    finally:
        shutil.rmtree(mps_dir, ignore_errors=True)
