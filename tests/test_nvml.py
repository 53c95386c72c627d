"""autotune.hardware.nvml against the fake pynvml (documented NVML behaviour) and the real module."""

import json

import pytest

from autotune.hardware import nvml
from fakes.gpu_host import fake_pynvml, gpu_uuid, load_fake_pynvml, write_nvml_config


def test_no_driver_is_graceful(monkeypatch):
    with fake_pynvml(monkeypatch, None):
        ok, why = nvml.available()
        assert not ok and "libnvidia-ml.so.1" in why and "no NVIDIA driver" in why
        assert nvml.devices() == [] and nvml.sample() == [] and nvml.driver_version() is None


def test_driver_not_loaded_says_so(monkeypatch, tmp_path):
    with fake_pynvml(monkeypatch, write_nvml_config(tmp_path, driver="not_loaded")):
        ok, why = nvml.available()
        assert not ok and "driver is not loaded" in why


def test_two_gpus(monkeypatch, tmp_path):
    with fake_pynvml(monkeypatch, write_nvml_config(tmp_path, gpus=2)):
        assert nvml.available() == (True, "")
        assert nvml.driver_version() == "550.54.15"
        devs = nvml.devices()
        assert [d.index for d in devs] == [0, 1]
        assert devs[1].uuid == gpu_uuid(1) and devs[1].name == "NVIDIA A100-SXM4-40GB"
        assert devs[1].mem_total_bytes == 40 * 2**30 and devs[1].mem_used_bytes == 2 * 2**30
        assert devs[1].util_pct == 20.0 and devs[1].power_w == pytest.approx(61.0)
        assert devs[0].pids == (4242,)
        sample = nvml.sample()
        assert set(sample[0]) == {"index", "name", "util_pct", "mem_used_bytes",
                                  "mem_total_bytes", "power_w", "pids"}
        assert sample[0]["pids"] == [4242]


def test_readings_return_the_sentinel_instead_of_raising(monkeypatch, tmp_path):
    config = write_nvml_config(tmp_path, gpus=2)
    data = json.loads(config.read_text())
    data["devices"][0]["power_mw"] = None  # NVMLError_NotSupported
    data["devices"][1]["lost"] = True  # NVMLError_GpuIsLost on every reading
    config.write_text(json.dumps(data))
    with fake_pynvml(monkeypatch, config):
        devs = nvml.devices()
        assert devs[0].power_w is nvml.NA and devs[0].util_pct == 10.0
        assert devs[1].name is nvml.NA and devs[1].mem_total_bytes is nvml.NA
        assert devs[1].pids == ()


def test_init_once_and_shutdown(monkeypatch, tmp_path):
    with fake_pynvml(monkeypatch, write_nvml_config(tmp_path)) as fake:
        nvml.devices()
        nvml.sample()
        assert fake.CALLS.count("nvmlInit") == 1
        nvml.shutdown()
        assert fake.CALLS[-1] == "nvmlShutdown"
        nvml.devices()  # initialised again on next use
        assert fake.CALLS.count("nvmlInit") == 2


def test_missing_module(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    nvml.shutdown()
    try:
        ok, why = nvml.available()
        assert not ok and "pip install nvidia-ml-py" in why
    finally:
        nvml.shutdown()


def test_fake_behaves_as_documented(monkeypatch, tmp_path):
    fake = load_fake_pynvml()
    assert isinstance(fake.NVMLError(fake.NVML_ERROR_DRIVER_NOT_LOADED),
                      fake.NVMLError_DriverNotLoaded)
    assert fake.NVMLError_GpuIsLost().value == fake.NVML_ERROR_GPU_IS_LOST
    with pytest.raises(fake.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    monkeypatch.delenv("FAKE_PYNVML_CONFIG", raising=False)
    with pytest.raises(fake.NVMLError_LibraryNotFound):
        fake.nvmlInit()
    monkeypatch.setenv("FAKE_PYNVML_CONFIG", str(write_nvml_config(tmp_path, gpus=1)))
    fake.nvmlInit()
    with pytest.raises(fake.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetHandleByIndex(1)
    fake.nvmlShutdown()
    with pytest.raises(fake.NVMLError_Uninitialized):
        fake.nvmlShutdown()


def test_real_pynvml_on_this_machine():
    """The real module: either a working driver, or a graceful 'why not'."""
    import pynvml

    assert not getattr(pynvml, "FAKE", False)
    nvml.shutdown()
    try:
        ok, why = nvml.available()
        assert ok or why
        if not ok:
            assert nvml.devices() == []
    finally:
        nvml.shutdown()
