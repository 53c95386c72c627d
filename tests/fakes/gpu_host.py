"""Helpers that turn a test into a fake GPU host: a fake NVML device set and the fake MPS daemon.

    config = write_nvml_config(tmp_path, gpus=2)
    env = fake_gpu_env(config, mps_dir)      # for a controller subprocess
    with fake_pynvml(monkeypatch, config):   # in this process
        ...
"""

import contextlib
import importlib.util
import json
import os
import sys
from pathlib import Path

FAKES = Path(__file__).resolve().parent
BIN = FAKES / "bin"
MPS_CONTROL = BIN / "nvidia-cuda-mps-control"
ROOT = FAKES.parent.parent


def gpu_uuid(index: int) -> str:
    return f"GPU-fa4e0000-0000-4000-8000-{index:012d}"


def write_nvml_config(directory, *, gpus=2, driver="loaded", **device_fields) -> Path:
    devices = [dict({"name": "NVIDIA A100-SXM4-40GB", "uuid": gpu_uuid(i),
                     "memory_total": 40 * 2**30, "memory_used": (i + 1) * 2**30,
                     "util_gpu": 10 * (i + 1), "power_mw": 60000 + 1000 * i,
                     "processes": [{"pid": 4242 + i, "used_memory": 2**20}]}, **device_fields)
               for i in range(gpus)]
    path = Path(directory) / "nvml.json"
    path.write_text(json.dumps({"driver": driver, "driver_version": "550.54.15",
                                "devices": devices}))
    return path


def fake_gpu_env(config: Path, mps_dir: str, base=None) -> dict:
    """Environment of a controller subprocess on the fake GPU host."""
    env = dict(os.environ if base is None else base)
    env["FAKE_PYNVML_CONFIG"] = str(config)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(FAKES), str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "")])
    env["AUTOTUNE_MPS_DIR"] = str(mps_dir)
    env["AUTOTUNE_MPS_KEEP"] = "1"
    env.pop("AUTOTUNE_MPS_CONTROL", None)
    return env


def load_fake_pynvml():
    spec = importlib.util.spec_from_file_location("pynvml", FAKES / "pynvml.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def fake_pynvml(monkeypatch, config=None):
    """``import pynvml`` gives the fake in this process; autotune.hardware.nvml starts afresh."""
    from autotune.hardware import nvml

    if config is None:
        monkeypatch.delenv("FAKE_PYNVML_CONFIG", raising=False)
    else:
        monkeypatch.setenv("FAKE_PYNVML_CONFIG", str(config))
    module = load_fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", module)
    nvml.shutdown()
    try:
        yield module
    finally:
        nvml.shutdown()
