"""What the benches share: printing as they go, an interval over rounds, and ``autotune tune``
run as a user runs it (a subprocess with ``--json``), timed.

Benches compare configurations in separate processes over interleaved rounds; the figure they
report is the mean of the per-round ratios with a 95% t-interval over the rounds.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from autotune.measuring.steady import t975  # noqa: E402


def say(msg: str) -> None:
    print(msg, flush=True)


def interval(ratios: Sequence[float]) -> tuple[float, float]:
    """The mean of ``ratios`` and its 95% half-width (t over the rounds): nan without any,
    infinite with one (one round shows no spread)."""
    if not ratios:
        return math.nan, math.inf
    m = sum(ratios) / len(ratios)
    if len(ratios) < 2:
        return m, math.inf
    sd = math.sqrt(sum((r - m) ** 2 for r in ratios) / (len(ratios) - 1))
    return m, t975(len(ratios) - 1) * sd / math.sqrt(len(ratios))


def ratio_interval(num: Sequence[float], den: Sequence[float]) -> tuple[float, float]:
    """`interval` of the per-round ratios ``num / den``, rounds with a missing figure left out."""
    return interval([a / b for a, b in zip(num, den) if a and b])


@dataclass(frozen=True)
class Tuned:
    """One ``autotune tune --json`` as a user runs it: its summary, or the error it ended with."""

    summary: dict | None
    wall_s: float
    error: str = ""


def tune_as_user(args: Sequence[str], *, script: Sequence[str], budget: str, work: Path,
                 env: dict, label: str, cwd: Path | None = None) -> Tuned:
    """``autotune tune --json --plain --budget B --recipe-dir WORK/recipes --no-warm-start ARGS
    -- SCRIPT`` in ``cwd`` (else WORK), timed, its stderr kept in WORK/tune.err; a failure is
    said with its stderr's tail."""
    cmd = [sys.executable, "-m", "autotune", "tune", "--json", "--plain", "--budget", budget,
           "--recipe-dir", str(work / "recipes"), "--no-warm-start", *args, "--", *script]
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=cwd or work, env=env, capture_output=True, text=True)
    wall_s = time.monotonic() - t0
    (work / "tune.err").write_text(p.stderr)
    if p.returncode != 0:
        say(f"{label}: tune failed ({p.returncode}):\n{p.stderr[-3000:]}")
        return Tuned(None, wall_s, p.stderr[-3000:])
    return Tuned(json.loads(p.stdout.strip().splitlines()[-1]), wall_s)
