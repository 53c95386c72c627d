"""Energy from the hardware's counters: RAPL through a powercap tree laid out as the kernel
documents it, NVML through the fake that behaves as NVIDIA documents."""

import time

import pytest

from autotune.measuring import energy
from fakes.gpu_host import fake_pynvml, write_nvml_config


def powercap(root, packages):
    """``intel-rapl:N`` package domains (energy_uj, max_energy_range_uj, name) with a core
    subdomain ``intel-rapl:N:0`` each, as /sys/class/powercap lays them out."""
    for n, (uj, top) in enumerate(packages):
        d = root / f"intel-rapl:{n}"
        d.mkdir(parents=True)
        (d / "name").write_text(f"package-{n}\n")
        (d / "energy_uj").write_text(f"{uj}\n")
        (d / "max_energy_range_uj").write_text(f"{top}\n")
        sub = root / f"intel-rapl:{n}:0"
        sub.mkdir()
        (sub / "name").write_text("core\n")
        (sub / "energy_uj").write_text("999999999\n")  # inside the package: never added
        (sub / "max_energy_range_uj").write_text(f"{top}\n")
    return root


def test_rapl_sums_the_packages_and_undoes_the_wrap(tmp_path):
    root = powercap(tmp_path / "powercap", [(1_000_000, 2**32), (2**32 - 500_000, 2**32)])
    rapl = energy.Rapl(root)
    assert len(rapl.domains) == 2 and rapl.why == ""
    assert rapl.read() == 0.0
    (root / "intel-rapl:0" / "energy_uj").write_text("4000000\n")  # +3 J
    (root / "intel-rapl:1" / "energy_uj").write_text("1500000\n")  # wrapped: +2 J
    assert rapl.read() == pytest.approx(5.0)


def test_rapl_absent_or_unreadable_says_why(tmp_path):
    assert "does not exist" in energy.Rapl(tmp_path / "none").why
    root = powercap(tmp_path / "powercap", [(1, 2**32)])
    (root / "intel-rapl:0" / "energy_uj").unlink()
    r = energy.Rapl(root)
    assert r.read() is None and "not readable" in r.why


def test_gpus_read_nvml_s_energy_counter(tmp_path, monkeypatch):
    cfg = write_nvml_config(tmp_path, gpus=2, energy_mj=1_000, energy_since=time.time())
    with fake_pynvml(monkeypatch, cfg):
        gpus = energy.Gpus([0, 1])
        assert gpus.source == "NVML energy counter"
        t0 = time.time()
        time.sleep(0.3)
        used = gpus.read(time.monotonic())
        # 60 W + 61 W for the time since the meter started
        assert used == pytest.approx(121.0 * (time.time() - t0), rel=0.2)


def test_gpus_without_the_counter_integrate_sampled_power(tmp_path, monkeypatch):
    cfg = write_nvml_config(tmp_path, gpus=1, energy_mj=None)  # a pre-Volta GPU
    with fake_pynvml(monkeypatch, cfg):
        gpus = energy.Gpus([0])
        assert gpus.source == "NVML power, sampled"
        assert gpus.read(10.0) == 0.0
        assert gpus.read(12.0) == pytest.approx(120.0)  # 60 W for 2 s


def test_no_driver_or_no_gpu_is_unavailable_with_the_reason(tmp_path, monkeypatch):
    with fake_pynvml(monkeypatch, None):
        g = energy.Gpus([0])
        assert g.read(1.0) is None and "NVML library" in g.why
    assert energy.Gpus([]).why == "no GPU in use"


def test_joules_per_sample_over_the_measured_span(tmp_path, monkeypatch):
    root = powercap(tmp_path / "powercap", [(0, 2**32)])
    monkeypatch.setenv("AUTOTUNE_RAPL_ROOT", str(root))
    m = energy.EnergyMeter([])
    for t, uj in ((0.0, 0), (5.0, 50_000_000), (10.0, 100_000_000), (15.0, 150_000_000)):
        (root / "intel-rapl:0" / "energy_uj").write_text(f"{uj}\n")
        m.read(t)
    e = m.per_sample(5.0, 15.0, samples=1000)  # 100 J over 1000 samples
    assert e.cpu_j == pytest.approx(0.1) and e.cpu_source == "RAPL package energy"
    assert e.gpu_j is None and e.gpu_source == "" and e.gpu_why == "no GPU in use"
    assert e.to_dict()["gpu"] == "unavailable: no GPU in use"  # as the journal has it
    assert energy.EnergyPerSample.from_dict(e.to_dict()) == e
    assert e.describe() == "GPU unavailable: no GPU in use; CPU package 0.1 J (RAPL package energy)"
    assert m.per_sample(20.0, 40.0, samples=1000).cpu_j is None  # beyond what was read


def test_a_span_past_the_last_reading_is_charged_the_power_read(tmp_path, monkeypatch):
    # 10 W read at the polls, the last 0.5 s before the span's end: the span's 8 s hold 80 J,
    # not the 75 J the readings reach
    root = powercap(tmp_path / "powercap", [(0, 2**32)])
    monkeypatch.setenv("AUTOTUNE_RAPL_ROOT", str(root))
    m = energy.EnergyMeter([])
    for t in (0.0, 2.0, 4.0, 6.0, 8.5):
        (root / "intel-rapl:0" / "energy_uj").write_text(f"{int(t * 10_000_000)}\n")
        m.read(t)
    assert m.per_sample(1.0, 9.0, samples=80).cpu_j == pytest.approx(1.0)
