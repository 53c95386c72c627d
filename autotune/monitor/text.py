"""Plain text: one readable line per journal event, and the small formatters the views share.

Pure functions, no control codes; used for pipes, ``--plain``, ``NO_COLOR``, and whenever the
live view fails. `LINES` gives each `Event` its line; `IGNORED` would name, with the reason, any
event that gets none (`tests/test_events.py` holds the two to every event).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping

from autotune.measuring.breakdown import Breakdown
from autotune.measuring.energy import EnergyPerSample
from autotune.measuring.noise import NoiseEstimate
from autotune.measuring.outcome import Outcome
from autotune.measuring.result import TrialResult
from autotune.store.events import Event
from autotune.tuning.decision import claim_text
from autotune.tuning.space.knobs import knobs_text

GIB = 1024 ** 3
SPARK = "▁▂▃▄▅▆▇█"


def unreadable_line(offsets: list[int], name: str = "events.jsonl") -> str | None:
    """One line for the journal lines a reader had to leave out (`RunState.unreadable`)."""
    if not offsets:
        return None
    n = len(offsets)
    where = f"byte {offsets[0]}" if n == 1 else "bytes " + ", ".join(map(str, offsets[:5]))
    return (f"{name}: {n} line{'s' if n > 1 else ''} could not be read ({where}"
            f"{', ...' if n > 5 else ''}); shown without {'it' if n == 1 else 'them'}")


def fmt_duration(seconds: float | None) -> str:
    """``1:02:03`` / ``2:03`` / ``-``."""
    if seconds is None or seconds != seconds:
        return "-"
    seconds = max(0, int(round(seconds)))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def fmt_rate(samples_per_s: float | None, ci_half: float | None = None) -> str:
    if samples_per_s is None:
        return "-"
    text = f"{samples_per_s:,.1f}"
    if ci_half is not None and ci_half > 0:
        # An infinite half-width: too few batches for an interval yet.
        text += f" ± {ci_half:,.1f}" if math.isfinite(ci_half) else " ± ?"
    return text


def fmt_gib(n_bytes: float | None) -> str:
    return "-" if n_bytes is None else f"{n_bytes / GIB:.1f}"


def sparkline(values, width: int = 40) -> str:
    """Unicode block sparkline of the last ``width`` values (None values shown as a space)."""
    vals = list(values)[-width:]
    nums = [v for v in vals if v is not None]
    if not nums:
        return ""
    lo, hi = min(nums), max(nums)
    span = hi - lo
    out = []
    for v in vals:
        if v is None:
            out.append(" ")
        else:
            i = int((v - lo) / span * (len(SPARK) - 1)) if span > 0 else len(SPARK) // 2
            out.append(SPARK[i])
    return "".join(out)


def bar(fraction: float, width: int = 20) -> str:
    """``█████░░░░░`` for a fraction in [0, 1]."""
    fraction = min(1.0, max(0.0, fraction))
    full = int(round(fraction * width))
    return "█" * full + "░" * (width - full)


def _script(command) -> str:
    for arg in command or []:
        if isinstance(arg, str) and arg.endswith(".py"):
            return os.path.basename(arg)
    return " ".join(map(str, command or [])) or "?"


def _trial_label(ev: dict) -> str:
    n = ev.get("number")
    return f"trial #{n}" if n is not None else str(ev.get("trial", "trial"))


def device_summary(ev: dict) -> str:
    """``cpu 43% (2 cores) · mem 3.1/7.8 GiB · 2 loader workers · GPU0 87% 10.1/40.0 GiB 250 W``."""
    parts = []
    cores = [c for c in (ev.get("cpu_pct") or []) if isinstance(c, (int, float))]
    if cores:
        parts.append(f"cpu {sum(cores) / len(cores):.0f}% ({len(cores)} cores)")
    if ev.get("mem_total_bytes"):
        parts.append(f"mem {fmt_gib(ev.get('mem_used_bytes'))}/"
                     f"{fmt_gib(ev.get('mem_total_bytes'))} GiB")
    if ev.get("workers") is not None:
        parts.append(f"{ev.get('workers')} loader workers")
    for g in ev.get("gpus") or []:
        if not isinstance(g, dict):
            continue
        text = f"GPU{g.get('index', '?')} {_pct(g.get('util_pct'))}"
        if g.get("mem_total_bytes"):
            text += f" {fmt_gib(g.get('mem_used_bytes'))}/{fmt_gib(g.get('mem_total_bytes'))} GiB"
        if g.get("power_w") is not None:
            text += f" {g['power_w']:.0f} W"
        if g.get("ranks"):
            text += f" ranks {','.join(map(str, g['ranks']))}"
        parts.append(text)
    return " · ".join(parts)


def _pct(v) -> str:
    return "-" if v is None else f"{v:.0f}%"


def event_line(ev: dict) -> str | None:
    """One readable line for an event (without time stamp); None for an unknown non-event."""
    name = ev.get("event")
    if not name:
        return None
    f = LINES.get(name)
    if f is not None:
        try:
            return f(ev)
        except (TypeError, ValueError, KeyError, AttributeError):
            pass
    fields = " ".join(f"{k}={v}" for k, v in ev.items() if k not in ("t", "event"))
    return f"{name} {fields}".rstrip()


def timed_line(ev: dict) -> str | None:
    """`event_line` prefixed with the event's local time, ``HH:MM:SS``."""
    line = event_line(ev)
    if line is None:
        return None
    t = ev.get("t")
    stamp = time.strftime("%H:%M:%S", time.localtime(t)) if isinstance(t, (int, float)) else "--:--:--"
    return f"{stamp} {line}"


def _run_started(ev):
    extra = []
    if ev.get("budget_s"):
        extra.append(f"budget {fmt_duration(ev['budget_s'])}")
    if ev.get("trials"):
        extra.append(f"up to {ev['trials']} trials")
    if ev.get("modes"):
        extra.append("modes " + ",".join(ev["modes"]))
    tail = f" ({', '.join(extra)})" if extra else ""
    return f"run started: autotune {ev.get('kind', '?')} {_script(ev.get('command'))}{tail}"


def _knobs_part(knobs, mode) -> str:
    """Knobs as text; nothing for a probe mode run with the script's own settings."""
    return "" if not knobs and mode not in (None, "full") else knobs_text(knobs)


def _trial_started(ev):
    mode = ev.get("mode") or "full"
    knobs = _knobs_part(ev.get("knobs"), mode)
    return f"{_trial_label(ev)} started: " + (f"{knobs} (mode {mode})" if knobs else f"mode {mode}")


def _trial_progress(ev):
    return (f"{_trial_label(ev)}: {fmt_rate(ev.get('samples_per_s'), ev.get('ci_half'))} "
            f"samples/s after {ev.get('measured_s', 0):.0f} s measured")


def _trial_finished(ev):
    raw = ev.get("result") or {}
    r = TrialResult.from_dict(raw)
    head = f"{_trial_label(ev)} {r.outcome.value}"
    if ev.get("mode") and ev.get("mode") != "full":
        head += f" (mode {ev['mode']})"
    knobs = _knobs_part(r.knobs, ev.get("mode") or r.mode.value)
    knobs = f" · {knobs}" if knobs else ""
    dur = fmt_duration(_recorded(raw, r, "duration_s"))
    if r.ok:
        flag = " [foreign load: not comparable]" if r.foreign_flagged else ""
        parts = r.breakdown
        time_goes = f" · time: {parts.short()}" if parts is not None and parts.short() else ""
        ended = f" · {r.reason}" if r.outcome is Outcome.ENDED and r.reason else ""
        rate = fmt_rate(_recorded(raw, r, "samples_per_s"), _recorded(raw, r, "ci_half"))
        return f"{head}: {rate} samples/s in {dur}{knobs}{time_goes}{flag}{ended}"
    log = f" (log: {r.log_path})" if r.log_path else ""
    return f"{head}: {r.reason or 'no reason given'}{knobs} · {dur}{log}"


def _recorded(raw: Mapping, r: TrialResult, name: str) -> float | None:
    """A figure of the result ``r`` read from ``raw``; None where the record lacks it (a
    journal of an older autotune): not recorded, shown as "-", not as 0."""
    return getattr(r, name) if name in raw else None


def _trial_pruned(ev):
    return f"{_trial_label(ev)} pruned: {ev.get('reason') or 'cannot beat the best'}"


def _confirmation(ev):
    chose = " (chooses between the best two)" if ev.get("chooses") else ""
    return (f"confirm round {ev.get('round')}{chose} {ev.get('trial')}: "
            f"{fmt_rate(ev.get('samples_per_s'), ev.get('ci_half'))} samples/s · "
            f"{knobs_text(ev.get('knobs'))}")


def _best(ev):
    rate = fmt_rate(ev.get("samples_per_s"), ev.get("ci_half"))
    base = ev.get("baseline_samples_per_s")
    speed = ev.get("speedup")
    vs = f", {speed:.2f}x the baseline {base:,.1f}" if speed and base else ""
    low, high = ev.get("speedup_low"), ev.get("speedup_high")
    if vs and isinstance(low, (int, float)) and isinstance(high, (int, float)) and \
            math.isfinite(high) and high > low:
        vs = f", {claim_text(speed, low, high)} the baseline {base:,.1f}"
    if ev.get("kept_baseline"):
        return (f"best: kept the baseline ({rate} samples/s): no config beat it beyond "
                f"doubt")
    keep = ev.get("keep_batch")
    kept = ""
    if isinstance(keep, dict):
        kept = (" · keeping the script's batch: the script's defaults"
                if keep.get("kept_baseline") else
                f" · keeping the script's batch: {fmt_rate(keep.get('samples_per_s'))} "
                f"samples/s, {knobs_text(keep.get('knobs'))}")
    return f"best: {rate} samples/s{vs} · {knobs_text(ev.get('knobs'))}{kept}"


def _verdict(ev):
    v = ev.get("verdict") or {}
    return f"verdict: {v.get('text', v) if isinstance(v, dict) else v}"


def _fullrun_started(ev):
    knobs = ev.get("knobs") or {}
    inst = f", instances {ev['instances']}" if ev.get("instances") and \
        "instances" not in knobs else ""
    launcher = ev.get("launcher")
    via = f", started by {launcher}" if launcher and launcher != "local" else ""
    return f"full run started: {knobs_text(knobs)}{inst}{via}"


def _fullrun_progress(ev):
    parts = [f"full run: {fmt_rate(ev.get('samples_per_s'))} samples/s"]
    if ev.get("steps") is not None:
        parts.append(f"step {ev['steps']:,}")
    if ev.get("samples") is not None:
        parts.append(f"{ev['samples']:,} samples")
    b = Breakdown.from_dict(ev.get("breakdown"))
    if b is not None and b.short():
        parts.append(f"time: {b.short()}")
    return " · ".join(parts)


def _fullrun_ended(ev):
    line = f"full run ended: exit code {ev.get('exit_code')}"
    why = f"stopped on {ev['signal']}" if ev.get("signal") else \
        f"rank {ev['rank']}" if ev.get("rank") is not None else ""
    if why:
        engine = ev.get("launcher_exit_code")
        line += f" ({why}" + (f"; the launcher returned {engine})" if engine is not None else ")")
    if ev.get("samples_per_s"):  # the steady span's, as a probe's: no start-up, no exit
        line += f"; steady {fmt_rate(ev['samples_per_s'])} samples/s"
    b = Breakdown.from_dict(ev.get("breakdown"))
    return line + (f"; where the time went: {b.describe()}" if b is not None else "")


def fullrun_notes(ev) -> list[str]:
    """What a ``fullrun_notes`` event tells: where the ranks run, and whether MPS serves them."""
    check = ev.get("mps_check") or {}
    return [*map(str, ev.get("notes") or []), *([str(check["text"])] if check.get("ok") else [])]


def allreduce_text(ev) -> str:
    """What an ``allreduce`` event found: where bigger buckets pay off, the candidates kept."""
    candidates = ", ".join(map(str, ev.get("candidates") or [])) or "none"
    r = ev.get("result")
    if not isinstance(r, dict):
        return (f"allreduce not timed ({str(ev.get('error') or '?').splitlines()[0]}); "
                f"bucket_mb candidates {candidates}")
    low, high = (r.get("bucket_mb_range") or [None, None])[:2]
    span = f", pays off from {low:g} to {high:g} MB" if low is not None else ""
    return (f"allreduce on {r.get('world_size', '?')} {r.get('backend', '?')} ranks{span}; "
            f"bucket_mb candidates {candidates}")


def pareto_text(ev) -> str:
    """What a ``pareto`` event says: how many configs make the front, and which was picked."""
    front = ev.get("front") or []
    names = ", ".join(str(p.get("name")) for p in front if isinstance(p, dict))
    within = ev.get("within_rel")
    rule = (f": the fastest within {within:.0%} of the best samples/J"
            if isinstance(within, (int, float)) else "")
    return (f"{len(front)} config(s) on the samples/s-samples/J front ({names or 'none'}); "
            f"picked {ev.get('picked') or '?'}{rule}")


LINES = {
    Event.RUN_STARTED: _run_started,
    Event.ALLREDUCE: allreduce_text,
    Event.TRIAL_STARTED: _trial_started,
    Event.TRIAL_PROGRESS: _trial_progress,
    Event.TRIAL_FINISHED: _trial_finished,
    Event.TRIAL_PRUNED: _trial_pruned,
    Event.CONFIRMATION: _confirmation,
    Event.BEST: _best,
    Event.PARETO: lambda ev: f"pareto: {pareto_text(ev)}",
    Event.RECIPE_SAVED: lambda ev: f"recipe saved: {ev.get('path')}",
    Event.MEMORY_FIT: lambda ev: f"memory: {ev['text']}",
    Event.BATCH_CHANGE: lambda ev: f"batch: {ev['text']}",
    Event.PAYBACK: lambda ev: f"payback: {ev['text']}",
    Event.PROBE_VERDICT: _verdict,
    Event.FULLRUN_STARTED: _fullrun_started,
    Event.FULLRUN_PROGRESS: _fullrun_progress,
    Event.FULLRUN_NOTES: lambda ev: "full run: " + "; ".join(fullrun_notes(ev)),
    Event.FULLRUN_PROMISE: lambda ev: ("WARNING: " if ev.get("below") else "") + ev["text"],
    Event.FULLRUN_ENDED: _fullrun_ended,
    Event.DEVICE_SAMPLE: lambda ev: f"device: {device_summary(ev)}",
    Event.RUN_ENDED: lambda ev: f"run ended: exit code {ev.get('exit_code')}",
    Event.RUN_AGAIN: lambda ev: f"started again as run {ev.get('run')}",
}
IGNORED: dict[Event, str] = {}  # every event has its line


def cost_text(core_s: float, gpu_s: float) -> str:
    """What one sample costs, in the unit a user buys: GPU-ms where GPUs ran, core-ms of CPU."""
    parts = [f"{gpu_s * 1000:.3g} GPU-ms"] if gpu_s > 0 else []
    if core_s > 0:
        parts.append(f"{core_s * 1000:.3g} core-ms")
    return ", ".join(parts) or "-"


def energy_text(e: dict | None) -> str:
    """Joules per sample by source, or why a source is unavailable, from the journal's
    ``EnergyPerSample.to_dict``."""
    energy = EnergyPerSample.from_dict(e)
    return energy.describe() if energy is not None else "not measured"


def noise_text(n: dict | None) -> str:
    """The gradient noise scale and what it stands on, or why there is none, from the
    journal's ``NoiseEstimate.to_dict``."""
    noise = NoiseEstimate.from_dict(n)
    return noise.describe() if noise is not None else "not measured"
