"""A fake 2-GPU host, 3 ranks per GPU at 40% threads each: a real controller process runs one
trial (tests/scripts/gpu_controller.py) against the fake NVML and the fake MPS daemon.

Checked: each rank's environment and device, every command the daemon received, MPS really
serving all six ranks, NCCL turned into gloo (and said), and the daemon gone after success,
after a rank crash, and after SIGINT to the controller.
"""

import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from autotune.hardware import fingerprint

from autotune.tuning import recipes
from autotune.store.journal import read_events
from fakes.gpu_host import fake_gpu_env, gpu_uuid, write_nvml_config

HERE = Path(__file__).resolve().parent
CONTROLLER = HERE / "scripts" / "gpu_controller.py"
TRAIN = str(HERE / "scripts" / "fake_gpu_train.py")
pytestmark = pytest.mark.slow


@pytest.fixture
def host(tmp_path):
    mps_dir = tempfile.mkdtemp(prefix="atg", dir="/tmp")  # short, as the daemon needs
    out = tmp_path / "ranks"
    out.mkdir()
    env = fake_gpu_env(write_nvml_config(tmp_path, gpus=2, energy_mj=5_000_000,
                                         energy_since=time.time()), mps_dir)
    env["FAKE_RANK_OUT"] = str(out)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.pop(var, None)  # the user sets none: torchrun's rule holds
    yield {"env": env, "mps_dir": Path(mps_dir), "out": out, "result": tmp_path / "result.json"}
    shutil.rmtree(mps_dir, ignore_errors=True)


def start_controller(host, *rank_args, max_s=60):
    return subprocess.Popen(
        [sys.executable, str(CONTROLLER), str(host["result"]), "3", "40", str(max_s),
         *rank_args], env=host["env"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True)


def control_log(host) -> str:
    logs = list(host["mps_dir"].glob("atmps-*/log/control.log"))
    assert len(logs) == 1, f"expected one daemon, found {logs}"
    return logs[0].read_text()


def daemon_pid(log: str) -> int:
    return int(re.search(r"Control (\d+)\]", log).group(1))


def alive(pid) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def assert_daemon_stopped(host):
    log = control_log(host)
    pid = daemon_pid(log)
    assert "Cmd:quit\n" in log and log.rstrip().endswith("Exit"), log
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid), "the MPS control daemon outlived the controller"
    servers = [int(s) for s in re.findall(r"Starting new server (\d+)", log)]
    assert servers and not any(alive(s) for s in servers)
    return log


def assert_no_rank_left(host):
    """No rank of *this* test's controller (other runs may share the machine) is alive."""
    for p in psutil.process_iter():
        try:
            env = p.environ()
            if env.get("AUTOTUNE_TRIAL", "").startswith("fakegpu-") and \
                    env.get("FAKE_RANK_OUT") == host["env"]["FAKE_RANK_OUT"]:
                assert p.status() == psutil.STATUS_ZOMBIE, f"rank process {p.pid} left behind"
        except psutil.Error:
            continue


def test_success_six_ranks_placed_and_daemon_stopped(host):
    ctl = start_controller(host, "--batches", "100000", max_s=30)
    out, _ = ctl.communicate(timeout=240)
    assert ctl.returncode == 0, out
    result = json.loads(host["result"].read_text())
    assert result["outcome"] in ("ok", "foreign-load"), result  # a shared machine may be busy
    records = [json.loads((host["out"] / f"rank-{r}.json").read_text()) for r in range(6)]
    pipe = next(host["mps_dir"].glob("atmps-*/pipe"))
    for r, rec in enumerate(records):
        assert rec["RANK"] == str(r) and rec["WORLD_SIZE"] == "6"
        assert rec["CUDA_VISIBLE_DEVICES"] == gpu_uuid(r // 3)  # ranks 0-2: GPU 0, 3-5: GPU 1
        assert rec["LOCAL_RANK"] == "0"  # torch.cuda.set_device(LOCAL_RANK) -> its own GPU
        assert rec["AUTOTUNE_HOST_LOCAL_RANK"] == str(r)
        assert rec["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"
        assert rec["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
        assert rec["mps_client"] is True
        assert rec["OMP_NUM_THREADS"] == rec["AUTOTUNE_THREADS"] == str(rec["torch_threads"])
        assert rec["OMP_NUM_THREADS"] == "1"  # torchrun's rule for a host of several ranks
        assert rec["HOROVOD_FUSION_THRESHOLD"] == str(8 * 2**20)
        assert rec["backend"] == "gloo"  # the script asked for nccl
    assert any("NCCL refuses two ranks on one GPU" in n["text"] for n in result["notes"])
    # both GPUs' energy counters (60 W and 61 W, as the fake NVML draws them) per sample
    energy = result["energy"]
    assert energy["gpu"] == "NVML energy counter"
    assert energy["gpu_j_per_sample"] == pytest.approx(121.0 / result["samples_per_s"], rel=0.1)
    assert "MPS serves 6 rank(s)" in out
    log = assert_daemon_stopped(host)
    commands = re.findall(r"Cmd:(.*)", log)
    server = re.search(r"Starting new server (\d+)", log).group(1)
    assert set(commands) <= {"get_server_list", f"get_client_list {server}", "quit"}
    assert commands[0] == "get_server_list" and commands[-1] == "quit"
    assert f"get_client_list {server}" in commands
    assert sorted(int(p) for p in re.findall(r"NEW CLIENT (\d+) from user \d+: active", log)) \
        == sorted(rec["pid"] for rec in records)
    assert_no_rank_left(host)


def test_rank_crash_still_stops_the_daemon(host):
    ctl = start_controller(host, "--crash-rank", "4", "--crash-after", "5", max_s=60)
    out, _ = ctl.communicate(timeout=240)
    assert ctl.returncode == 0, out
    result = json.loads(host["result"].read_text())
    assert result["outcome"] == "crashed" and "crashed on purpose" in result["reason"], result
    rank_log = Path(result["log_path"]).parent / "fakegpu.rank4.log"
    assert "rank 4 crashed on purpose" in rank_log.read_text()
    assert_daemon_stopped(host)
    assert_no_rank_left(host)


def test_sigint_to_the_controller_stops_ranks_then_the_daemon(host):
    ctl = start_controller(host, "--batches", "100000", "--sleep", "0.05", max_s=300)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            logs = list(host["mps_dir"].glob("atmps-*/log/control.log"))
            if logs and len(re.findall(r"NEW CLIENT \d+ from user \d+: active",
                                       logs[0].read_text())) == 6:
                break
            assert ctl.poll() is None, ctl.communicate()[0]
            time.sleep(0.1)
        else:
            raise AssertionError("the six ranks never reached the MPS daemon")
        ctl.send_signal(signal.SIGINT)
        out, _ = ctl.communicate(timeout=120)
    finally:
        if ctl.poll() is None:
            ctl.kill()
    assert ctl.returncode != 0 and "KeyboardInterrupt" in out
    assert not host["result"].exists()
    log = assert_daemon_stopped(host)
    # the ranks were gone before the daemon was told to quit
    assert log.rindex("disconnected") < log.index("Cmd:quit")
    assert_no_rank_left(host)


def test_the_full_run_tells_whether_mps_serves_its_ranks(host, tmp_path):
    """``autotune run`` with 2 clients per GPU: the full run goes through the same rank group as
    a probe, so its MPS check and placement notes reach the journal and the monitor."""
    fp = fingerprint.Fingerprint(cpu_model="x", cores=2, gpu_count=2,
                                 gpu_names=("NVIDIA A100-SXM4-40GB",) * 2)
    recipe = recipes.save(recipes.Recipe(
        name="gpu", knobs={"instances": 2, "thread_pct": 50}, samples_per_s=1.0, ci_half=0.1,
        baseline_samples_per_s=1.0, speedup=1.0, kept_baseline=True, fingerprint=fp,
        script_path=TRAIN), tmp_path)
    env = dict(host["env"], AUTOTUNE_RUNS_DIR=str(tmp_path / "runs"))
    p = subprocess.run([sys.executable, "-m", "autotune", "run", "--plain", "--recipe",
                        str(recipe), TRAIN, "--run-seconds", "2"], cwd=tmp_path, env=env,
                       text=True, capture_output=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    run_dir, = (tmp_path / "runs").iterdir()
    events, _ = read_events(run_dir)
    told = [e for e in events if e["event"] == "fullrun_notes"]
    assert len(told) == 1, told
    assert told[0]["mps_check"]["ok"] and "MPS serves 4 rank(s)" in told[0]["mps_check"]["text"]
    assert any("NCCL refuses two ranks on one GPU" in n for n in told[0]["notes"])
    names = [e["event"] for e in events]
    assert names.index("fullrun_started") < names.index("fullrun_notes") \
        < names.index("fullrun_ended")
    assert "full run: 2 ranks share each GPU" in p.stderr and "MPS serves 4 rank(s)" in p.stderr
    assert_daemon_stopped(host)
    assert_no_rank_left(host)
