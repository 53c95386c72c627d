"""A fake powercap tree whose RAPL package counter grows as a package drawing power would.

The kernel lays RAPL out under /sys/class/powercap: ``intel-rapl:N`` package domains with
``energy_uj`` (microjoules, wrapping at ``max_energy_range_uj``) and ``name``, and subdomains
``intel-rapl:N:M`` inside them. autotune reads the tree ``AUTOTUNE_RAPL_ROOT`` names.

    with growing_powercap(tmp_path / "powercap", watts=20.0) as root:
        env["AUTOTUNE_RAPL_ROOT"] = str(root)
"""

import contextlib
import threading
import time
from pathlib import Path

MAX_RANGE_UJ = 262143328850  # what an Intel package reports


def powercap_tree(root: Path, start_uj: int = 0) -> Path:
    """One package domain and its core subdomain, as the kernel lays them out."""
    pkg = Path(root) / "intel-rapl:0"
    pkg.mkdir(parents=True)
    (pkg / "name").write_text("package-0\n")
    (pkg / "energy_uj").write_text(f"{start_uj}\n")
    (pkg / "max_energy_range_uj").write_text(f"{MAX_RANGE_UJ}\n")
    core = Path(root) / "intel-rapl:0:0"
    core.mkdir()
    (core / "name").write_text("core\n")
    (core / "energy_uj").write_text("0\n")
    (core / "max_energy_range_uj").write_text(f"{MAX_RANGE_UJ}\n")
    return Path(root)


@contextlib.contextmanager
def growing_powercap(root: Path, *, watts: float, every_s: float = 0.05):
    """The tree, its package counter advanced by ``watts`` every ``every_s`` (wrapping as the
    kernel's does) while the block runs."""
    root = powercap_tree(root)
    counter = root / "intel-rapl:0" / "energy_uj"
    stop = threading.Event()

    def grow():
        t0, uj = time.monotonic(), 0.0
        while not stop.wait(every_s):
            uj = watts * (time.monotonic() - t0) * 1e6
            tmp = counter.with_suffix(".tmp")
            tmp.write_text(f"{int(uj) % MAX_RANGE_UJ}\n")
            tmp.replace(counter)  # a reader sees a whole number, as sysfs gives

    thread = threading.Thread(target=grow, daemon=True)
    thread.start()
    try:
        yield root
    finally:
        stop.set()
        thread.join()
