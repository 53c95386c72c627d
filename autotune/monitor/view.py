"""The live view as pure functions: `RunState` (and the time now) in, rich renderables out.

No clock and no terminal here, so tests render recorded journals into ``Console(record=True)``
and read what a person would see. `SHOWN` names the part that shows each `Event`; `IGNORED`
would name, with the reason, one the view leaves out (`tests/test_events.py` holds the two to
every event).
"""

from __future__ import annotations

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from autotune.measuring.outcome import USABLE, Outcome
from autotune.monitor import text as fmt
from autotune.monitor.state import RUNNING, RunState, TrialRow
from autotune.store.events import Event, RunKind
from autotune.tuning.space.knobs import knobs_text
from probes import protocol

OUTCOME_STYLE = {Outcome.OK.value: "green", Outcome.ENDED.value: "green", RUNNING: "yellow",
                 Outcome.PRUNED.value: "magenta",
                 Outcome.FOREIGN_LOAD.value: "yellow"}  # every other outcome is a failure: red


def render(state: RunState, *, now: float, title: str = "", max_rows: int = 12) -> Group:
    """The whole monitor: header, trials, best, findings, full run / verdict, devices."""
    parts = [header(state, now=now, title=title)]
    if state.trials:
        parts.append(trials_table(state, now=now, max_rows=max_rows))
    best = best_panel(state)
    if best is not None:
        parts.append(best)
    found = findings_panel(state)
    if found is not None:
        parts.append(found)
    run = fullrun_panel(state, now=now)
    if run is not None:
        parts.append(run)
    dev = device_panel(state)
    if dev is not None:
        parts.append(dev)
    return Group(*parts)


# -- header --------------------------------------------------------------------------------
def hardware_text(state: RunState) -> str:
    """What the run says it runs on; from the latest device sample when the run did not say."""
    hw = state.hardware
    if isinstance(hw, str) and hw:
        return hw
    if isinstance(hw, dict) and hw:
        parts = []
        for key, value in hw.items():
            if isinstance(value, list) and value and isinstance(value[0], dict):
                names = sorted({str(v.get("name", "?")) for v in value})
                parts.append(f"{len(value)} x {'/'.join(names)}")
            elif isinstance(value, (dict, list)):
                continue
            else:
                parts.append(f"{key} {value}")
        return ", ".join(parts)
    dev = state.device or {}
    parts = []
    if dev.get("cpu_pct"):
        parts.append(f"{len(dev['cpu_pct'])} cores")
    if dev.get("mem_total_bytes"):
        parts.append(f"{fmt.fmt_gib(dev['mem_total_bytes'])} GiB")
    gpus = [g for g in dev.get("gpus") or [] if isinstance(g, dict)]
    if gpus:
        names = sorted({str(g.get("name", "GPU")) for g in gpus})
        parts.append(f"{len(gpus)} x {'/'.join(names)}")
    elif parts:
        parts.append("no GPU")
    return ", ".join(parts) or "-"


def elapsed_s(state: RunState, now: float) -> float | None:
    if state.started_t is None:
        return None
    end = state.ended_t if state.ended else now
    return max(0.0, end - state.started_t)


def eta_s(state: RunState, now: float) -> float | None:
    """Seconds left: from the time budget, the trial budget (mean trial time), or both."""
    if state.ended:
        return 0.0
    el = elapsed_s(state, now)
    guesses = []
    if state.budget_s and el is not None:
        guesses.append(max(0.0, state.budget_s - el))
    if state.trials_budget:
        done = [r for r in state.finished_rows if r.duration_s]
        if done:
            mean = sum(r.duration_s for r in done) / len(done)
            guesses.append(max(0, state.trials_budget - len(state.finished_rows)) * mean)
    return min(guesses) if guesses else None


def progress_fraction(state: RunState, now: float) -> float | None:
    """Share of the budget used; a run that ended well is done (1.0) whatever its budget."""
    if state.ended and not state.exit_code:
        return 1.0
    el = elapsed_s(state, now)
    fractions = []
    if state.budget_s and el is not None:
        fractions.append(el / state.budget_s)
    if state.trials_budget:
        fractions.append(len(state.finished_rows) / state.trials_budget)
    return min(1.0, max(fractions)) if fractions else None


def header(state: RunState, *, now: float, title: str = "") -> Panel:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("script", " ".join(map(str, state.command)) or "?")
    grid.add_row("hardware", hardware_text(state))
    phase = Text(state.phase)
    if state.ended:
        phase.stylize("green" if not state.exit_code else "red")
    grid.add_row("phase", phase)
    el = elapsed_s(state, now)
    line = Text(f"{fmt.fmt_duration(el)}")
    if state.budget_s:
        line.append(f" / {fmt.fmt_duration(state.budget_s)} budget")
    if state.trials_budget:
        line.append(f" · {len(state.finished_rows)}/{state.trials_budget} trials")
    frac = progress_fraction(state, now)
    if frac is not None:
        line.append(f"  {fmt.bar(frac)} {frac:.0%}", style="cyan")
    eta = eta_s(state, now)
    if eta is not None and not state.ended:
        line.append(f"  ETA {fmt.fmt_duration(eta)}")
    grid.add_row("elapsed", line)
    head = title or f"autotune {state.kind or 'run'} · {state.script}"
    return Panel(grid, title=head, title_align="left", border_style="blue")


# -- trials --------------------------------------------------------------------------------
def visible_rows(state: RunState, max_rows: int) -> tuple[list[TrialRow], int]:
    """The rows to show (best and running always; then the latest) and how many are hidden."""
    rows = state.rows
    if len(rows) <= max_rows:
        return rows, 0
    best = state.best_row
    keep = {id(r) for r in rows if not r.finished or r is best}
    for r in reversed(rows):
        if len(keep) >= max_rows:
            break
        keep.add(id(r))
    shown = [r for r in rows if id(r) in keep]
    return shown, len(rows) - len(shown)


def outcome_text(row: TrialRow) -> Text:
    style = OUTCOME_STYLE.get(row.status, "red")
    text = Text(row.status, style=style)
    if row.reason:
        text.append(f": {row.reason}", style=style if row.status not in USABLE else "")
    elif row.foreign_flagged:
        text.append(": foreign load, not comparable", style="yellow")
    return text


def trials_table(state: RunState, *, now: float, max_rows: int = 12) -> Table:
    rows, hidden = visible_rows(state, max_rows)
    best = state.best_row if state.kind is not RunKind.PROBE else None
    show_mode = any(r.mode != protocol.Mode.FULL for r in state.rows)
    show_knobs = state.kind is not RunKind.PROBE or any(r.knobs for r in state.rows)
    caption = f"{hidden} earlier trials not shown" if hidden else None
    table = Table(title="trials", title_justify="left", caption=caption, expand=False,
                  header_style="bold")
    table.add_column("", width=1)
    table.add_column("trial")
    if show_mode:
        table.add_column("mode")
    if show_knobs:
        table.add_column("knobs", overflow="fold")
    table.add_column("samples/s ± CI", justify="right")
    table.add_column("outcome", overflow="fold", ratio=1)
    table.add_column("time", justify="right")
    for r in rows:
        is_best = r is best and r.ok
        mark = "★" if is_best else ("▶" if not r.finished else "")
        dur = r.duration_s if r.finished else (now - r.started_t if r.started_t else None)
        rate = fmt.fmt_rate(r.samples_per_s, r.ci_half)
        if not r.finished and r.samples_per_s is not None:
            rate += " …"
        cells = [mark, r.label] + ([r.mode] if show_mode else [])
        if show_knobs:
            cells.append(knobs_text(r.knobs) if r.knobs or r.mode == protocol.Mode.FULL else "")
        cells += [rate, outcome_text(r), fmt.fmt_duration(dur)]
        table.add_row(*cells, style="bold" if is_best else ("dim" if r.status == Outcome.PRUNED
                                                            else None))
    return table


# -- best vs baseline ----------------------------------------------------------------------
def history(state: RunState) -> list[float | None]:
    """Throughput of finished full-mode trials in order (None for a failed one)."""
    return [r.samples_per_s if r.ok else None for r in state.rows
            if r.finished and r.mode == protocol.Mode.FULL and r.status != Outcome.PRUNED]


def best_so_far(values) -> list[float | None]:
    out, top = [], None
    for v in values:
        if v is not None and (top is None or v > top):
            top = v
        out.append(top)
    return out


def best_panel(state: RunState) -> Panel | None:
    if state.kind is RunKind.PROBE and state.best is None:
        return None
    best = state.best_row
    if state.best is None and best is None:
        return None
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    base = state.baseline_samples_per_s
    if state.best is not None:
        b = state.best
        rate = fmt.fmt_rate(b.get("samples_per_s"), b.get("ci_half"))
        knobs = knobs_text(b.get("knobs"))
        speedup = b.get("speedup")
        kept = bool(b.get("kept_baseline"))
    else:
        rate = fmt.fmt_rate(best.samples_per_s, best.ci_half)
        knobs = f"{best.label} {knobs_text(best.knobs)}"
        speedup = (best.samples_per_s / base) if base and best.samples_per_s else None
        kept = False
    line = Text(f"{rate} samples/s · {knobs}")
    grid.add_row("best" if state.best is not None else "best so far", line)
    if base:
        grid.add_row("baseline", f"{fmt.fmt_rate(base)} samples/s")
    if kept:
        grid.add_row("speedup", Text("none beyond doubt: kept the defaults", style="yellow"))
    if state.best is not None and state.best.get("reason"):
        grid.add_row("why", str(state.best["reason"]))
    elif speedup:
        grid.add_row("speedup", Text(f"{speedup:.2f}x", style="bold green" if speedup > 1
                                     else "yellow"))
    values = history(state)
    if len(values) > 1:
        grid.add_row("history", Text(fmt.sparkline(values), style="cyan"))
        grid.add_row("best so far", Text(fmt.sparkline(best_so_far(values)), style="green"))
    if state.confirmations:
        last = state.confirmations[-1]
        grid.add_row("confirming", f"round {last.get('round')}: {len(state.confirmations)} "
                                   f"re-measurements")
    if state.recipe_path:
        grid.add_row("recipe", state.recipe_path)
    return Panel(grid, title="best vs baseline", title_align="left", border_style="green")


# -- what tuning found besides the best ----------------------------------------------------
def findings(state: RunState) -> list[tuple[str, str]]:
    """(label, text) of what the run found besides its best: the allreduce timing, the Pareto
    front, memory by batch, a changed global batch, and whether tuning pays for itself; the
    lines `autotune.monitor.text` gives their events."""
    out = []
    if state.allreduce is not None:
        out.append(("allreduce", fmt.allreduce_text(state.allreduce)))
    if state.pareto is not None:
        out.append(("pareto", fmt.pareto_text(state.pareto)))
    if state.memory and state.memory.get("text"):
        out.append(("memory", str(state.memory["text"])))
    if state.batch_note:
        out.append(("batch", state.batch_note))
    if state.payback and state.payback.get("text"):
        out.append(("payback", str(state.payback["text"])))
    return out


def findings_panel(state: RunState) -> Panel | None:
    rows = findings(state)
    if not rows:
        return None
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    for label, text in rows:
        grid.add_row(label, text)
    return Panel(grid, title="findings", title_align="left", border_style="yellow")


# -- full run and verdict -----------------------------------------------------------------
def fullrun_panel(state: RunState, *, now: float) -> Panel | None:
    fr = state.fullrun
    rates = state.mode_rates()
    if fr is None and state.verdict is None and not rates:
        return None
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    if fr is not None:
        status = ("running" if fr.exit_code is None else f"ended, exit code {fr.exit_code}")
        line = Text(f"{fmt.fmt_rate(fr.samples_per_s)} samples/s")
        if fr.steps is not None:
            line.append(f" · step {fr.steps:,}")
        if fr.samples is not None:
            line.append(f" · {fr.samples:,} samples")
        grid.add_row("full run", Text(status, style="yellow" if fr.exit_code is None
                                      else ("green" if fr.exit_code == 0 else "red")))
        grid.add_row("live", line)
        if fr.knobs:
            grid.add_row("knobs", knobs_text(fr.knobs) + (
                f" · instances {fr.instances}" if fr.instances else ""))
        for note in fr.notes:
            grid.add_row("note", Text(note, style="red" if note.startswith("WARNING") else ""))
        if fr.promise:
            grid.add_row("promise", Text(fr.promise, style="red" if fr.below_promise else ""))
        parts = fr.breakdown
        if parts is not None:
            grid.add_row("time" if fr.exit_code is None else "time (whole run)",
                         parts.describe())
        if len(fr.history) > 1:
            grid.add_row("trend", Text(fmt.sparkline([v for _, v in fr.history]),
                                         style="cyan"))
    if rates:
        top = max((v for v in rates.values() if v), default=0.0)
        rows = state.mode_rows()
        for mode in protocol.MODES:
            if mode in rates:
                v = rates[mode]
                status = rows[mode].status if mode in rows else "failed"
                cell = (Text(f"{fmt.bar(v / top if top else 0, 24)} {v:,.1f}/s", style="cyan")
                        if v else Text(f"no throughput ({status})", style="red"))
                grid.add_row(mode, cell)
    if state.verdict is not None:
        grid.add_row("verdict", Text(str(state.verdict.get("text", "")), style="bold"))
    title = "full run" if fr is not None else ("probe modes" if rates else "verdict")
    return Panel(grid, title=title, title_align="left", border_style="magenta")


# -- devices -------------------------------------------------------------------------------
def device_panel(state: RunState) -> Panel | None:
    dev = state.device
    if not dev:
        return None
    gpus = [g for g in dev.get("gpus") or [] if isinstance(g, dict)]
    parts = []
    if gpus:
        table = Table(box=None, header_style="bold", pad_edge=False)
        for col in ("gpu", "name", "util", "", "memory GiB", "power", "ranks"):
            table.add_column(col, justify="right" if col in ("util", "power") else "left")
        for g in gpus:
            util = g.get("util_pct")
            mem_u, mem_t = g.get("mem_used_bytes"), g.get("mem_total_bytes")
            mem = f"{fmt.fmt_gib(mem_u)}/{fmt.fmt_gib(mem_t)}" if mem_t else "-"
            power = f"{g['power_w']:.0f} W" if g.get("power_w") is not None else "-"
            ranks = ",".join(map(str, g.get("ranks") or [])) or "-"
            table.add_row(f"GPU{g.get('index', '?')}", str(g.get("name", "")),
                          f"{util:.0f}%" if util is not None else "-",
                          Text(fmt.bar((util or 0) / 100, 12), style="cyan"), mem, power, ranks)
        parts.append(table)
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    cores = [c for c in dev.get("cpu_pct") or [] if isinstance(c, (int, float))]
    if cores:
        avg = sum(cores) / len(cores)
        if len(cores) <= 8:
            per = "  ".join(f"{i}:{fmt.bar(c / 100, 6)}{c:3.0f}%" for i, c in enumerate(cores))
        else:  # one cell per core, fixed 0-100 scale
            per = "".join(fmt.SPARK[min(7, int(c / 100 * 8))] for c in cores)
        grid.add_row("cpu", Text(f"{avg:.0f}% avg  ") + Text(per, style="cyan"))
    if dev.get("mem_total_bytes"):
        used, total = dev.get("mem_used_bytes") or 0, dev["mem_total_bytes"]
        grid.add_row("memory", Text(f"{fmt.fmt_gib(used)}/{fmt.fmt_gib(total)} GiB  ")
                     + Text(fmt.bar(used / total, 12), style="cyan"))
    if dev.get("workers") is not None:
        ranks = dev.get("ranks")
        grid.add_row("processes", (f"{ranks} ranks, " if ranks is not None else "")
                     + f"{dev['workers']} loader workers")
    parts.append(grid)
    return Panel(Group(*parts), title="devices", title_align="left", border_style="cyan")


# The part of the view that shows each journal event.
SHOWN = {
    Event.RUN_STARTED: header, Event.RUN_ENDED: header,
    Event.TRIAL_STARTED: trials_table, Event.TRIAL_PROGRESS: trials_table,
    Event.TRIAL_FINISHED: trials_table, Event.TRIAL_PRUNED: trials_table,
    Event.CONFIRMATION: best_panel, Event.BEST: best_panel, Event.RECIPE_SAVED: best_panel,
    Event.ALLREDUCE: findings_panel, Event.PARETO: findings_panel,
    Event.MEMORY_FIT: findings_panel, Event.BATCH_CHANGE: findings_panel,
    Event.PAYBACK: findings_panel,
    Event.PROBE_VERDICT: fullrun_panel, Event.FULLRUN_STARTED: fullrun_panel,
    Event.FULLRUN_PROGRESS: fullrun_panel, Event.FULLRUN_NOTES: fullrun_panel,
    Event.FULLRUN_PROMISE: fullrun_panel,
    Event.FULLRUN_ENDED: fullrun_panel,
    Event.DEVICE_SAMPLE: device_panel,
}
IGNORED: dict[Event, str] = {
    Event.RUN_AGAIN: "written after the run's end, when 'autotune run --again' starts it "
                     "again; 'autotune ps' and the plain lines name the new run",
}
