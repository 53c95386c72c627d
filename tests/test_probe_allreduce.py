"""``autotune probe --allreduce``: the allreduce table and bucket_mb range in the probe's output."""

import subprocess
import sys
import textwrap

import pytest

from conftest import last_json

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    data = TensorDataset(torch.randn(256, 8), torch.zeros(256))
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(100000):
        for x, y in DataLoader(data, batch_size=16):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
""")


def test_probe_shows_allreduce_by_size(tmp_path):
    script = tmp_path / "tiny.py"
    script.write_text(SCRIPT)
    out = subprocess.run(
        [sys.executable, "-m", "autotune", "probe", "--allreduce", "--modes", "full",
         "--seconds", "30", "--json", "--runs-dir", str(tmp_path / "runs"), str(script)],
        capture_output=True, text=True, timeout=400, cwd=tmp_path)
    summary = last_json(out)
    ar = summary["allreduce"]
    assert ar["backend"] == "gloo" and ar["world_size"] == 2
    sizes = [p["bytes"] for p in ar["points"]]
    assert sizes[0] == 4096 and sizes[-1] == 256 * 2**20 and len(sizes) == 9
    low, high = ar["bucket_mb_range"]
    assert 1 <= low <= high <= 256
    assert "timing allreduce" in out.stderr
