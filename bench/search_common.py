"""What both modes of ``bench/bench_search.py`` share: tune's own baseline stage (the space
it searches), the bench's header line, its target and the verdict on it."""

from __future__ import annotations

import datetime
import json
import math
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from autotune.launching import engines  # noqa: E402
from autotune.hardware import fingerprint  # noqa: E402
from autotune.store.journal import Journal  # noqa: E402
from autotune.tuning import Prober, TuneSettings, TuneState, baseline, space  # noqa: E402
from bench.common import say  # noqa: E402

TARGET = 0.95  # tuned / grid-best the search must reach; below it the bench exits 1


def fmt(cfg: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in cfg.items())


def header(command: list[str]) -> str:
    fp = fingerprint.current(command)
    started = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    return (f"# bench_search {started} on {platform.node() or 'host'}: {fp.cores} cores "
            f"({fp.cpu_model}), {platform.machine()}, Python {platform.python_version()}, "
            f"torch {fp.torch_version}")


def baseline_stage(args, baseline_values: dict[str, int] | None = None) \
        -> tuple[Prober, TuneState]:
    """``autotune tune``'s own baseline stage on ``args.command``: the state holding the space
    it searches (``--space`` applied)."""
    stage_dir = args.work / "baseline-stage"
    stage_dir.mkdir()
    settings = TuneSettings(command=tuple(args.command), cwd=str(args.work), seconds=args.seconds,
                            ranges=space.parse_space(args.space),
                            baseline_values=baseline_values or {},
                            foreign_limit_cores=args.foreign_limit,
                            foreign_retries=args.foreign_retries)
    prober = Prober(stage_dir, Journal(stage_dir), engines.resolve("local"),
                    notify=lambda note: say(f"# {note.kind.value}: {note.text}"))
    stage_t0 = time.monotonic()
    state = baseline.measure(prober, TuneState.new(settings, stage_dir))
    sp = state.space
    say(f"# baseline stage: {time.monotonic() - stage_t0:.0f} s; notes: "
        f"{[n.text for n in sp.notes]}")
    say(f"# space: {json.dumps({k: list(v) for k, v in sp.domains.items()})} fixed "
        f"{json.dumps(dict(sp.fixed))}: {sp.size()} configs; default {fmt(sp.baseline)}")
    return prober, state


def mean(values) -> float | None:
    """The mean of the figures there are (None: a run without one); None without any."""
    got = [v for v in values if v]
    return sum(got) / len(got) if got else None


def verdict(ratio: float, half: float) -> int:
    """0 when tuned / grid-best meets `TARGET`; 1 when it misses it, or when the side by side
    measured nothing (no ratio, or no interval)."""
    if not math.isfinite(ratio) or not math.isfinite(half):
        say("FAILED: the side by side gave no ratio with an interval; nothing was measured")
        return 1
    if ratio < TARGET:
        say(f"FAILED: tuned / grid-best {ratio:.3f} is below the target {TARGET:.2f}")
        return 1
    return 0
