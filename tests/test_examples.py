"""The bundled examples run as plain scripts, alone and as two DDP ranks."""

import os
import subprocess
import sys

import pytest

from conftest import EXAMPLES

pytestmark = pytest.mark.slow


def run(script, *args, env=None, timeout=240):
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def test_image_example_generates_data_and_trains(tmp_path):
    r = run(EXAMPLES / "image_classifier" / "train.py", "--num-images", "64", "--data-dir",
            str(tmp_path / "data"), "--max-steps", "4", "--log-interval", "2")
    assert r.returncode == 0, r.stderr
    assert "done: 2 steps" in r.stdout  # 64 images / 32 per batch, one epoch
    assert "samples/s" in r.stdout
    pngs = list((tmp_path / "data").glob("*.png"))
    assert len(pngs) == 64
    with open(pngs[0], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_compute_example_trains():
    r = run(EXAMPLES / "compute_bound" / "train.py", "--num-samples", "256", "--hidden", "256",
            "--max-steps", "6", "--log-interval", "3")
    assert r.returncode == 0, r.stderr
    assert "step 3 loss" in r.stdout and "done: 6 steps" in r.stdout


def test_compute_example_as_two_ddp_ranks(tmp_path):
    """torchrun's environment by hand: two ranks join a gloo group and train together."""
    env = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(29600 + os.getpid() % 300),
           "LOCAL_WORLD_SIZE": "2"}
    script = EXAMPLES / "compute_bound" / "train.py"
    args = ["--num-samples", "256", "--hidden", "128", "--max-steps", "4", "--log-interval", "2"]
    procs = [subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env={**os.environ, **env, "RANK": str(r), "LOCAL_RANK": str(r)})
             for r in range(2)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outs]
    assert "done: 4 steps" in outs[0][0]  # rank 0 logs
    assert outs[1][0] == ""  # rank 1 is quiet


def test_bad_flag_is_a_usage_error():
    r = run(EXAMPLES / "compute_bound" / "train.py", "--batch-size", "0")
    assert r.returncode == 2 and "--batch-size must be >= 1" in r.stderr


def test_image_example_data_is_prepared_before_training(tmp_path):
    """``prepare_data.py`` makes the dataset ``train.py`` would make on first use (so that no
    probe times it), and says so; a second call finds it there and writes nothing."""
    data = tmp_path / "data"
    args = ("--num-images", "12", "--data-dir", str(data))
    r = run(EXAMPLES / "image_classifier" / "prepare_data.py", *args)
    assert r.returncode == 0, r.stderr
    assert "data: generating 12 images" in r.stdout and f"data: ready in {data}" in r.stdout
    assert len(list(data.glob("*.png"))) == 12 and (data / "labels.csv").exists()
    again = run(EXAMPLES / "image_classifier" / "prepare_data.py", *args)
    assert again.returncode == 0 and "already in" in again.stdout, again.stderr
    trained = run(EXAMPLES / "image_classifier" / "train.py", *args, "--batch-size", "4",
                  "--log-interval", "1")
    assert trained.returncode == 0, trained.stderr
    assert "generating" not in trained.stdout and "done: 3 steps" in trained.stdout
