"""The offline HTML report of a run: one self-contained file, no remote resource, no script.

Built from the run's journal (and its ``study.db`` for parameter importance when present):
summary, best vs baseline, the confirmation rounds, the recipe, probe-mode bars, where the time
goes, optimisation history, throughput against each knob, parameter importance, the Pareto
front, memory by batch, what else tuning found, the full run, and the trials table. Charts are
inline SVG (`autotune.report.svg`); the data behind them is also embedded as JSON
(``<script type="application/json" id="autotune-data">``, data only, never executed).
`SECTIONS` names the section that shows each journal `Event`; `IGNORED` names, with the reason,
those the report leaves out (`tests/test_events.py` holds the two to every event).
"""

from __future__ import annotations

import os
import time
from html import escape
from pathlib import Path

from autotune.store import jsontext
from autotune.measuring.breakdown import LABELS
from autotune.tuning.memory import MemoryFit
from autotune.measuring.outcome import Outcome
from autotune.report import importance, svg
from autotune.store.journal import read_events
from autotune.monitor.state import RunState, TrialRow, fold
from autotune.monitor import console
from autotune.monitor.text import allreduce_text, fmt_duration, fmt_rate, unreadable_line
from autotune.store.events import Event, RunKind
from autotune.tuning.decision import claim_text
from autotune.tuning.space.knobs import knobs_text
from probes import protocol

RECIPE_MAX_BYTES = 64 * 1024
LOG_X_KNOBS = ("batch_size", "bucket_mb")

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:2em auto;max-width:1180px;
color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9em}td,th{padding:.25em .6em;border-bottom:1px solid #eee;
text-align:left;vertical-align:top}th{background:#f6f6f6}td.num{text-align:right;
font-variant-numeric:tabular-nums}tr.best{background:#e8f5e9;font-weight:bold}
tr.failed td.outcome{color:#c62828}tr.pruned{color:#777}.charts{display:flex;flex-wrap:wrap;gap:1em}
figure{margin:0}figcaption{font-size:.85em;color:#555}svg.chart{font-size:11px;background:#fff;
border:1px solid #eee}svg .label{font-size:12px;fill:#333}pre{background:#f6f6f6;padding:1em;
overflow:auto}.speedup{font-size:1.3em;color:#1a9850}.empty{color:#888}.note{color:#666;font-size:.9em}
"""


def load_state(run_dir: Path) -> RunState:
    skipped: list[int] = []
    events, _ = read_events(Path(run_dir), skipped=skipped)
    state = fold(events)
    state.unreadable = skipped
    return state


def trial_data(state: RunState) -> list[dict]:
    best = state.best_row if state.kind is not RunKind.PROBE else None
    out = []
    for r in state.rows:
        out.append({"trial": r.name, "number": r.number, "mode": r.mode, "knobs": r.knobs,
                    "outcome": r.status, "reason": r.reason, "samples_per_s": r.samples_per_s,
                    "ci_half": r.ci_half, "duration_s": r.duration_s, "best": r is best})
    return out


def search_rows(state: RunState) -> list[TrialRow]:
    """Finished trials of the search (full mode), in the order they ran."""
    return [r for r in state.rows if r.finished and r.mode == protocol.Mode.FULL
            and (state.kind is not RunKind.PROBE or r.knobs)]


def _kind(r: TrialRow, best: TrialRow | None) -> str:
    if r is best:
        return "best"
    if r.ok:
        return "ok"
    return "pruned" if r.status == Outcome.PRUNED else "failed"


def _y(r: TrialRow):
    return r.samples_per_s if (r.ok or r.status == Outcome.PRUNED) and r.samples_per_s else None


def _title(r: TrialRow) -> str:
    head = f"{r.label} {r.status}: {fmt_rate(r.samples_per_s, r.ci_half)} samples/s"
    return f"{head} · {knobs_text(r.knobs)}" + (f" · {r.reason}" if r.reason else "")


def history_chart(state: RunState) -> str:
    rows = search_rows(state)
    best = state.best_row
    points, step, top = [], [], None
    for i, r in enumerate(rows):
        x = r.number if r.number is not None else i
        points.append({"x": x, "y": _y(r), "kind": _kind(r, best), "title": _title(r)})
        if r.ok and r.samples_per_s and (top is None or r.samples_per_s > top):
            top = r.samples_per_s
        step.append((x, top))
    return svg.scatter(points, chart="history", x_label="trial",
                              y_label="samples/s", step_line=step)


def knob_charts(state: RunState) -> list[tuple[str, str]]:
    rows = search_rows(state)
    best = state.best_row
    knobs = list(dict.fromkeys(k for r in rows for k in r.knobs))
    out = []
    for knob in knobs:
        pts = [{"x": r.knobs[knob], "y": _y(r), "kind": _kind(r, best), "title": _title(r)}
               for r in rows if knob in r.knobs]
        if len({str(p["x"]) for p in pts}) < 2:
            continue
        xs = [p["x"] for p in pts if isinstance(p["x"], (int, float))]
        log_x = knob in LOG_X_KNOBS and xs and min(xs) > 0 and max(xs) / min(xs) >= 8
        out.append((knob, svg.scatter(pts, chart=f"knob:{knob}", x_label=knob,
                                             y_label="samples/s", log_x=bool(log_x))))
    return out


def read_recipe(state: RunState) -> tuple[str | None, str]:
    """(TOML text or None, the path as found) of the saved recipe."""
    if not state.recipe_path:
        return None, ""
    path = Path(state.recipe_path).expanduser()
    for cand in ([path] if path.is_absolute() else [Path(state.cwd or ".") / path, path]):
        try:
            if cand.is_file() and cand.stat().st_size <= RECIPE_MAX_BYTES:
                return cand.read_text(errors="replace"), str(cand)
        except OSError:
            continue
    return None, str(path)


def _table(rows: list[tuple[str, str]]) -> str:
    return "<table>" + "".join(f"<tr><th>{escape(k)}</th><td>{v}</td></tr>" for k, v in rows) \
        + "</table>"


def summary_section(state: RunState) -> str:
    from autotune.monitor.view import hardware_text

    counts: dict[str, int] = {}
    for r in state.rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    started = (time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(state.started_t))
               if state.started_t else "-")
    dur = ((state.ended_t or state.last_t or 0) - state.started_t) if state.started_t else None
    rows = [("command", f"<code>{escape(' '.join(map(str, state.command)))}</code>"),
            ("directory", escape(state.cwd or "-")), ("hardware", escape(hardware_text(state))),
            ("started", escape(started)), ("duration", escape(fmt_duration(dur))),
            ("status", escape(state.phase if state.ended or not state.sessions else
                              f"{state.phase}; its last session has no run_ended (still "
                              f"running, or killed)")),
            ("trials", escape(", ".join(f"{n} {k}" for k, n in counts.items()) or "none"))]
    if state.budget_s:
        rows.append(("budget", escape(fmt_duration(state.budget_s))))
    return "<h2>Summary</h2>" + _table(rows)


def best_section(state: RunState) -> str:
    if state.kind is RunKind.PROBE and state.best is None:
        return ""
    b = state.best
    best = state.best_row
    base = state.baseline_samples_per_s
    if b is None and best is None:
        return "<h2>Best vs baseline</h2><p class='empty'>no successful trial</p>"
    if b is not None:
        rate, knobs, speedup = (fmt_rate(b.get("samples_per_s"), b.get("ci_half")),
                                knobs_text(b.get("knobs")), b.get("speedup"))
    else:
        rate, knobs = fmt_rate(best.samples_per_s, best.ci_half), knobs_text(best.knobs)
        speedup = best.samples_per_s / base if base and best.samples_per_s else None
    rows = [("best", escape(f"{rate} samples/s")), ("knobs", f"<code>{escape(knobs)}</code>")]
    if base:
        rows.append(("baseline", escape(f"{fmt_rate(base)} samples/s")))
    if b is not None and b.get("kept_baseline"):
        rows.append(("speedup", "none beyond doubt: the script's defaults were kept"))
    elif speedup:
        low, high = (b or {}).get("speedup_low"), (b or {}).get("speedup_high")
        claim = claim_text(speedup, low, high) if isinstance(low, (int, float)) and \
            isinstance(high, (int, float)) and high > low and high < float("inf") else \
            f"{speedup:.3f}x"
        rows.append(("speedup", f"<span class='speedup'>{escape(claim)}</span>"))
    if b is not None and b.get("reason"):
        rows.append(("decision", escape(str(b["reason"]))))
    keep = (b or {}).get("keep_batch")
    if isinstance(keep, dict):  # the winner changes the job's batch: the one that keeps it
        if keep.get("kept_baseline"):
            kept = escape("the script's defaults (nothing that keeps it was faster beyond doubt)")
        else:
            low, high = keep.get("speedup_low"), keep.get("speedup_high")
            claim = claim_text(keep.get("speedup") or 1.0, low, high) \
                if isinstance(low, (int, float)) and isinstance(high, (int, float)) else \
                f"{keep.get('speedup') or 1.0:.3f}x"
            kept = (f"{fmt_rate(keep.get('samples_per_s'), keep.get('ci_half'))} samples/s, "
                    f"{escape(claim)}, <code>{escape(knobs_text(keep.get('knobs')))}</code>")
        rows.append(("keeping the script's batch", kept))
    text, where = read_recipe(state)
    if where:
        rows.append(("recipe", f"<code>{escape(where)}</code>"))
    html = "<h2>Best vs baseline</h2>" + _table(rows)
    if text is not None:
        html += f"<h3>Recipe</h3><pre class='recipe'>{escape(text)}</pre>"
    elif where:
        html += "<p class='note'>the recipe file could not be read from here</p>"
    return html


def search_importance(state: RunState, run_dir: Path) -> tuple[dict[str, float], str]:
    rows = search_rows(state)
    if not rows:
        return {}, "no search in this run"
    ok = [(r.knobs, r.samples_per_s) for r in rows if r.ok and r.samples_per_s]
    return importance.importance(run_dir, ok)


def search_section(state: RunState, imp: dict[str, float], how: str) -> str:
    rows = search_rows(state)
    if not rows:
        return ""
    html = ("<h2>Optimisation history</h2><figure>" + history_chart(state) +
            "<figcaption>samples/s per trial; green line: best so far; crosses: failed; "
            "grey: pruned</figcaption></figure>")
    charts = knob_charts(state)
    if charts:
        html += "<h2>Throughput against each knob</h2><div class='charts'>"
        html += "".join(f"<figure>{svg}<figcaption>{escape(k)}</figcaption></figure>"
                        for k, svg in charts) + "</div>"
    html += "<h2>Parameter importance</h2>"
    if imp:
        items = [(k, round(v * 100, 1), f"{k}: {v:.1%}") for k, v in imp.items()]
        html += (svg.bars(items, chart="importance", unit="%") +
                 f"<p class='note'>{escape(how)}</p>")
    else:
        html += f"<p class='empty'>{escape(how)}</p>"
    return html


def probe_section(state: RunState) -> str:
    rates = state.mode_rates()
    if not rates and state.verdict is None:
        return ""
    html = "<h2>Probe modes</h2>"
    if rates:
        items = []
        mode_rows = state.mode_rows()
        for mode in protocol.MODES:
            if mode in rates:
                row = mode_rows.get(mode)
                why = f": {row.reason}" if row is not None and row.reason else ""
                items.append((mode, rates[mode], f"{mode} {fmt_rate(rates[mode])} samples/s{why}"))
        html += svg.bars(items, chart="probe-modes", unit="/s")
        html += ("<p class='note'>full: as is; synthetic: first batches replayed, no input "
                 "pipeline (compute ceiling); io: loader drained, no training (input ceiling)</p>")
    if state.verdict is not None:
        html += f"<p><b>verdict:</b> {escape(str(state.verdict.get('text', '')))}</p>"
    return html


def breakdown_section(state: RunState) -> str:
    """Where the time goes, for the baseline and the best (a probe: its full mode)."""
    picks = []
    if state.kind is RunKind.PROBE:
        row = state.mode_rows().get("full")
        picks = [("full", row)] if row is not None else []
    else:
        base = state.trials.get("baseline")
        picks = [("baseline", base), ("best", state.best_row)]
    if state.fullrun is not None:
        picks.append(("full run", state.fullrun))
    rows = []
    for label, row in picks:
        b = row.breakdown if row is not None else None
        if b is not None:
            rows.append((label, [(LABELS[p], s, f"{label}: {LABELS[p]} {s:.0%} ±{h * 100:.0f} "
                                  f"points of wall time") for p, (s, h) in b.shares.items()]))
    if not rows:
        return ""
    return ("<h2>Where the time goes</h2>" + svg.stacked(rows, chart="breakdown") +
            "<p class='note'>shares of each rank's wall time over the measured span (the full "
            "run: over the whole run once it has ended, else since its last report): waiting "
            "for the next batch, forward (to the backward pass), backward, communication "
            "not hidden behind it, the optimizer step, and the rest</p>")


def memory_section(state: RunState) -> str:
    """Memory by batch size: one rank's peak in each measured probe, the fitted line, and the
    batches that fit (seed 003's chart)."""
    pts = [r.memory for r in state.rows if r.memory is not None]
    kinds = {k for _, _, k in pts}
    kind = "gpu" if "gpu" in kinds else "host"
    pts = [(b, m) for b, m, k in pts if k == kind]
    fit = MemoryFit.of(pts, kind)
    said = (state.memory or {}).get("text")
    if fit is None:  # the journal's probes are too few for a chart; the run's fit has more
        return (f"<h2>Memory by batch size</h2><p class='note'>{escape(str(said))}</p>"
                if said else "")
    mb = 2**20
    points = [{"x": b, "y": round(m / mb, 1), "kind": "ok",
               "title": f"batch {b}: {m / mb:.0f} MB per rank"} for b, m in pts]
    xs = sorted({b for b, _ in pts})
    trend = [(b, fit.at(b) / mb) for b in xs]
    text = said or fit.describe()
    return ("<h2>Memory by batch size</h2><figure>" +
            svg.scatter(points, chart="memory", x_label="per-rank batch",
                        y_label=f"{'GPU' if kind == 'gpu' else 'host'} MB per rank",
                        trend=trend, log_x=max(xs) / max(1, min(xs)) >= 8) +
            f"</figure><p class='note'>{escape(text)}</p>")


def pareto_section(state: RunState) -> str:
    """--objective throughput,energy: every config in samples/s against samples/J, the front
    marked, the pick named."""
    p = state.pareto
    if not p or not p.get("points"):
        return ""
    front = p.get("front") or []
    rows = "".join(f"<li{' class=best' if q['name'] == p.get('picked') else ''}>"
                   f"{escape(q['name'])}: <code>{escape(knobs_text(q.get('knobs') or {}))}</code>"
                   f" {q['samples_per_s']:.1f} samples/s, {q['samples_per_j']:.3g} samples/J"
                   f"</li>" for q in front)
    within = p.get("within_rel", 0.1)
    return ("<h2>Pareto front: samples/s against samples/J</h2><figure>" +
            svg.pareto(p["points"], front, chart="pareto", picked=p.get("picked", "")) +
            f"<figcaption>the front joined, its configs ringed; picked "
            f"({escape(str(p.get('picked')))}, green): the fastest within {within:.0%} of "
            f"the front's best samples/J"
            f"</figcaption></figure><ul>{rows}</ul>")


def confirmation_section(state: RunState) -> str:
    """Each re-measurement of the top configs and the baseline, in the order they ran."""
    if not state.confirmations:
        return ""
    body = []
    for c in state.confirmations:
        rate = _num(c.get("samples_per_s"))
        ci = _num(c.get("ci_half"))
        outcome = str(c.get("outcome") or (Outcome.OK.value if rate else "-"))
        why = f": {c['reason']}" if c.get("reason") else ""
        rnd = f"{c.get('round')} (chose)" if c.get("chooses") else str(c.get("round"))
        body.append(f"<tr><td class='num'>{escape(rnd)}</td>"
                    f"<td>{escape(str(c.get('trial')))}</td>"
                    f"<td><code>{escape(knobs_text(c.get('knobs')))}</code></td>"
                    f"<td class='num'>{escape(fmt_rate(rate, ci))}</td>"
                    f"<td>{escape(outcome + why)}</td></tr>")
    return ("<h2>Confirmation</h2><table class='confirmation'><tr><th>round</th><th>config</th>"
            "<th>knobs</th><th>samples/s</th><th>outcome</th></tr>" + "".join(body) +
            "</table><p class='note'>the top configs and the baseline re-measured in separate "
            "processes, interleaved; the best above is decided on these. A round marked "
            "(chose) ran the search's best two and kept one; it counts for the one kept</p>")


def _num(v):
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def findings(state: RunState) -> list[tuple[str, str]]:
    """(label, text) of what tuning found that no other section shows: the allreduce timing,
    a changed global batch, and whether tuning pays for itself."""
    out = []
    if state.allreduce is not None:
        out.append(("allreduce", allreduce_text(state.allreduce)))
    if state.batch_note:
        out.append(("batch", state.batch_note))
    if state.payback and state.payback.get("text"):
        out.append(("payback", str(state.payback["text"])))
    return out


def findings_section(state: RunState) -> str:
    rows = findings(state)
    if not rows:
        return ""
    return "<h2>Findings</h2>" + _table([(k, escape(v)) for k, v in rows])


def fullrun_section(state: RunState) -> str:
    fr = state.fullrun
    if fr is None:
        return ""
    t0 = fr.started_t or (fr.history[0][0] if fr.history else 0.0)
    pts = [(t - t0, v) for t, v in fr.history if t is not None]
    status = "running" if fr.exit_code is None else f"exit code {fr.exit_code}"
    rows = [("status", escape(status)), ("knobs", escape(knobs_text(fr.knobs))),
            ("last samples/s", escape(fmt_rate(fr.samples_per_s)))]
    if fr.steps is not None:
        rows.append(("steps", f"{fr.steps:,}"))
    rows += [("note", escape(note)) for note in fr.notes]
    if fr.promise:
        rows.append(("against the recipe", escape(fr.promise)))
    return ("<h2>Full run</h2>" + _table(rows) +
            svg.line(pts, chart="fullrun", x_label="seconds", y_label="samples/s"))


def trials_section(state: RunState) -> str:
    if not state.rows:
        return ""
    best = state.best_row if state.kind is not RunKind.PROBE else None
    head = ("<tr><th>trial</th><th>mode</th><th>knobs</th><th>samples/s</th><th>± CI</th>"
            "<th>outcome</th><th>reason</th><th>time</th></tr>")
    body = []
    for r in state.rows:
        cls = "best" if r is best else ("" if r.ok or not r.finished else
                                        ("pruned" if r.status == Outcome.PRUNED else "failed"))
        ci = f"{r.ci_half:,.1f}" if r.ci_half else "-"
        knobs = knobs_text(r.knobs) if r.knobs or state.kind is not RunKind.PROBE else ""
        body.append(
            f"<tr class='{cls}'><td>{escape(r.label)}</td><td>{escape(r.mode)}</td>"
            f"<td><code>{escape(knobs)}"
            f"</code></td><td class='num'>{escape(fmt_rate(r.samples_per_s))}</td>"
            f"<td class='num'>{ci}</td><td class='outcome'>{escape(r.status)}</td>"
            f"<td>{escape(r.reason)}</td><td class='num'>{fmt_duration(r.duration_s)}</td></tr>")
    return "<h2>Trials</h2><table class='trials'>" + head + "".join(body) + "</table>"


def build_html(run_dir: Path, state: RunState | None = None) -> str:
    """The report of ``run_dir`` as one HTML string."""
    run_dir = Path(run_dir)
    state = state if state is not None else load_state(run_dir)
    title = f"autotune {state.kind or 'run'} · {state.script}"
    imp, how = search_importance(state, run_dir)
    data = {"run_dir": str(run_dir), "kind": str(state.kind or ""), "command": state.command,
            "best": state.best, "baseline_samples_per_s": state.baseline_samples_per_s,
            "probe_modes": state.mode_rates(), "verdict": state.verdict,
            "trials": trial_data(state), "importance": imp, "importance_method": how,
            "fullrun": [[t, v] for t, v in state.fullrun.history] if state.fullrun else [],
            "pareto": state.pareto}
    blob = jsontext.dumps(data).replace("</", "<\\/")
    parts = [summary_section(state), best_section(state), confirmation_section(state),
             probe_section(state), breakdown_section(state), search_section(state, imp, how),
             pareto_section(state), memory_section(state), findings_section(state),
             fullrun_section(state), trials_section(state)]
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body>"
            f"<h1>{escape(title)}</h1><p class='note'>run directory "
            f"<code>{escape(str(run_dir))}</code> · report written "
            f"{escape(time.strftime('%Y-%m-%d %H:%M:%S'))} by autotune</p>"
            + "".join(p for p in parts if p) +
            f"<script type='application/json' id='autotune-data'>{blob}</script>"
            "</body></html>\n")


def write_report(run_dir: Path, out: Path | None = None) -> Path:
    """Write the report (default ``<run_dir>/report.html``) atomically; returns its path."""
    from autotune.store.rundir import write_atomic

    out = Path(out) if out else Path(run_dir) / "report.html"
    if out.parent and not out.parent.exists():
        os.makedirs(out.parent, exist_ok=True)
    state = load_state(Path(run_dir))
    write_atomic(out, build_html(run_dir, state))
    line = unreadable_line(state.unreadable)
    if line:
        console.warning(line)
    return out


# The section of the report that shows each journal event.
SECTIONS = {
    Event.RUN_STARTED: summary_section, Event.RUN_ENDED: summary_section,
    Event.TRIAL_STARTED: trials_section, Event.TRIAL_PROGRESS: trials_section,
    Event.TRIAL_FINISHED: trials_section, Event.TRIAL_PRUNED: trials_section,
    Event.CONFIRMATION: confirmation_section, Event.BEST: best_section,
    Event.RECIPE_SAVED: best_section, Event.PROBE_VERDICT: probe_section,
    Event.PARETO: pareto_section, Event.MEMORY_FIT: memory_section,
    Event.ALLREDUCE: findings_section, Event.BATCH_CHANGE: findings_section,
    Event.PAYBACK: findings_section,
    Event.FULLRUN_STARTED: fullrun_section, Event.FULLRUN_PROGRESS: fullrun_section,
    Event.FULLRUN_NOTES: fullrun_section, Event.FULLRUN_ENDED: fullrun_section,
    Event.FULLRUN_PROMISE: fullrun_section,
}
IGNORED = {
    Event.RUN_AGAIN: "written after the run's end, when 'autotune run --again' starts it "
                     "again; the new run has a report of its own",
    Event.DEVICE_SAMPLE: "the machine's readings from moment to moment; the report is of the "
                         "run's results (the hardware line reads the last one only when the run "
                         "named no hardware)",
}
