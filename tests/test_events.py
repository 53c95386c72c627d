"""The journal's schema (`autotune.store.events`): writers keep to it, every reader decides about
every event, and docs/internals.md says the same."""

import ast
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from autotune.measuring.trial_events import TrialEvents
from autotune.monitor import fold, render, state, text, view
from autotune.report import html
from autotune.store.events import FIELDS, Event, check
from autotune.store.journal import EVENTS, Journal, read_events
from autotune.tuning.space import knobs_text
from test_study import machine  # noqa: F401 - a fixture

ROOT = Path(__file__).resolve().parent.parent
JOURNALS = Path(__file__).parent / "data" / "journals"

READERS = {"monitor/state.py": (state.HANDLERS, state.IGNORED),
           "monitor/text.py": (text.LINES, text.IGNORED),
           "monitor/view.py": (view.SHOWN, view.IGNORED),
           "report/html.py": (html.SECTIONS, html.IGNORED)}


# -- the schema and its writers --------------------------------------------------------------
def test_every_event_has_its_fields_and_a_field_is_required_or_optional_not_both():
    assert set(FIELDS) == set(Event)
    for event, spec in FIELDS.items():
        assert not set(spec.required) & set(spec.optional), event
        assert not {"t", "event"} & spec.names, event


def test_the_journal_refuses_an_unknown_event_a_missing_field_and_a_stray_one(tmp_path):
    j = Journal(tmp_path)
    with pytest.raises(ValueError, match="must be one of run_started, .*but got 'trial_done'"):
        j.emit("trial_done", trial="t")
    with pytest.raises(ValueError, match="'batch_change' takes text, but got no fields: "
                                         "missing text"):
        j.emit(Event.BATCH_CHANGE)
    with pytest.raises(ValueError, match="unknown samples"):
        j.emit(Event.RECIPE_SAVED, path="x.toml", samples=3)
    with pytest.raises(ValueError, match="unknown event"):
        j.emit(Event.RUN_ENDED, exit_code=0, event="run_started")
    assert read_events(tmp_path)[0] == []  # nothing written
    j.emit(Event.RUN_ENDED, exit_code=0, t=5.0)  # optional `error` left out; `t` given
    (ev,), _ = read_events(tmp_path)
    assert ev == {"t": 5.0, "event": "run_ended", "exit_code": 0}
    assert check("run_ended", {"exit_code": 1}) is Event.RUN_ENDED


def _emit_calls():
    """(file, line, first argument) of every ``….emit(...)`` call in the controller."""
    for f in sorted((ROOT / "autotune").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "emit" and node.args:
                yield f.relative_to(ROOT), node.lineno, node.args[0]


def test_writers_name_their_events_by_the_enum_never_by_a_string():
    calls = list(_emit_calls())
    assert len(calls) > 20
    named = set()
    for where, line, arg in calls:
        assert not isinstance(arg, ast.Constant), f"{where}:{line} emits a string literal"
        if isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name) \
                and arg.value.id == "Event":
            named.add(Event[arg.attr])
        else:  # a pass-through: `Prober.emit(event, ...)`
            assert isinstance(arg, ast.Name), f"{where}:{line}"
    assert named == set(Event), f"no writer emits {set(Event) - named}"


def test_recorded_journals_still_replay_within_the_schema():
    for path in sorted(JOURNALS.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            ev = json.loads(line)
            fields = set(ev) - {"t", "event"}
            assert fields <= FIELDS[Event(ev["event"])].names, (path.name, ev["event"])


def test_a_probe_writes_its_trial_events_whole(tmp_path):
    class Estimate:
        samples_per_s, ci_half, measured_s = 120.0, 4.0, 3.0

    told = TrialEvents(Journal(tmp_path), "probe-io", None, "io")
    told.started({})
    told.progress(Estimate())
    told.finished({"outcome": "ok", "samples_per_s": 120.0})
    evs, _ = read_events(tmp_path)
    assert [(e["event"], e["trial"]) for e in evs] == [
        ("trial_started", "probe-io"), ("trial_progress", "probe-io"),
        ("trial_finished", "probe-io")]
    assert evs[0]["number"] is None and evs[0]["mode"] == "io" and evs[0]["knobs"] == {}
    assert evs[2]["result"]["samples_per_s"] == 120.0


# -- every reader decides about every event ------------------------------------------------
@pytest.mark.parametrize("reader", READERS)
def test_every_reader_shows_or_ignores_on_purpose_every_event(reader):
    handled, ignored = READERS[reader]
    assert set(handled) | set(ignored) == set(Event), \
        f"{reader} has not decided about {set(Event) - set(handled) - set(ignored)}"
    assert not set(handled) & set(ignored), reader
    assert all(isinstance(why, str) and why for why in ignored.values()), reader
    assert all(callable(f) for f in handled.values()), reader


# -- what tuning found, in every reader --------------------------------------------------------
PAYBACK = ("tuning cost 3m 00s, projected saving 12m 40s over the run (--epochs 90 x 50,000 "
           "samples: 1h 02m at the script's own settings, 49m 20s with the winner): tuning "
           "pays for itself")
MEMORY = "one rank takes 310.0 MB + 1.2 MB per sample; batches up to 512 per rank fit one rank"
BATCH = "the winner trains with a global batch of 256 (the script's own: 64)"


def findings_run(tmp_path) -> Path:
    """A short tuning run that found everything, written through the journal (so: in the
    schema)."""
    j = Journal(tmp_path)
    j.emit(Event.RUN_STARTED, kind="tune", command=["train.py"], cwd=str(tmp_path), t=0.0)
    for i, (batch, rate) in enumerate(((32, 200.0), (128, 260.0))):
        name = "baseline" if i == 0 else "trial-0"
        j.emit(Event.TRIAL_STARTED, trial=name, number=None if i == 0 else 0, mode="full",
               knobs={"batch_size": batch}, t=1.0 + 10 * i)
        j.emit(Event.TRIAL_FINISHED, trial=name, number=None if i == 0 else 0, mode="full",
               t=9.0 + 10 * i, result={"outcome": "ok", "samples_per_s": rate, "ci_half": 5.0,
                                       "knobs": {"batch_size": batch}, "duration_s": 8.0})
        if i == 0:
            j.emit(Event.ALLREDUCE, candidates=[1, 5, 25], t=9.5, error="the allreduce probe "
                   "failed (exit codes [1, 1]); see x.log:\ntrace")
    j.emit(Event.CONFIRMATION, round=1, trial="trial-0", knobs={"batch_size": 128},
           samples_per_s=None, ci_half=None, outcome="crashed", reason="exit code 1", t=30.0)
    j.emit(Event.PARETO, t=31.0, within_rel=0.1, picked="trial-0", points=[], front=[
        {"name": "trial-0", "knobs": {"batch_size": 128}, "samples_per_s": 260.0,
         "samples_per_j": 3.2}])
    j.emit(Event.BEST, knobs={"batch_size": 128}, samples_per_s=260.0, ci_half=5.0,
           baseline_samples_per_s=200.0, speedup=1.3, kept_baseline=False, reason="",
           speedup_low=1.2, speedup_high=1.4, objective="throughput", score=None,
           baseline_score=None, t=32.0)
    j.emit(Event.PAYBACK, tuning_s=180.0, run={"samples": 4.5e6, "how": "--epochs 90"},
           baseline_run_s=3720.0, best_run_s=2960.0, saving_s=760.0, text=PAYBACK, t=33.0)
    j.emit(Event.MEMORY_FIT, fixed_bytes=3.1e8, per_sample_bytes=1.2e6, points=[[32, 3.5e8]],
           kind="host", available_bytes=4e9, ranks=1, max_batch=512, text=MEMORY, t=33.0)
    j.emit(Event.BATCH_CHANGE, text=BATCH, t=33.0)
    j.emit(Event.FULLRUN_STARTED, command=["train.py"], knobs={"batch_size": 128}, instances=2,
           launcher="local", t=40.0)
    j.emit(Event.FULLRUN_NOTES, notes=["collectives on gloo: 2 ranks share the host"],
           mps_check=None, t=40.5)
    j.emit(Event.FULLRUN_ENDED, exit_code=0, t=50.0)
    j.emit(Event.RUN_ENDED, exit_code=0, t=51.0)
    return tmp_path


def screen_of(run_dir: Path, width: int = 200) -> str:
    s = fold(read_events(run_dir)[0])
    console = Console(record=True, width=width, file=open("/dev/null", "w"), color_system=None)
    console.print(render(s, now=60.0))
    return console.export_text()


def test_the_plain_lines_say_what_tuning_found(tmp_path):
    lines = [text.event_line(e) for e in read_events(findings_run(tmp_path))[0]]
    assert f"payback: {PAYBACK}" in lines
    assert f"memory: {MEMORY}" in lines and f"batch: {BATCH}" in lines
    assert ("allreduce not timed (the allreduce probe failed (exit codes [1, 1]); see x.log:); "
            "bucket_mb candidates 1, 5, 25") in lines
    assert ("pareto: 1 config(s) on the samples/s-samples/J front (trial-0); picked trial-0: "
            "the fastest within 10% of the best samples/J") in lines


def test_the_live_view_shows_what_the_plain_lines_show(tmp_path):
    screen = screen_of(findings_run(tmp_path))
    flat = " ".join(screen.split())  # a long text folds inside its panel
    for label, said in (("payback", PAYBACK), ("memory", MEMORY), ("batch", BATCH)):
        assert re.search(rf"│ {label} +{re.escape(said[:40])}", screen), (label, screen)
        assert " ".join(said.split()) in flat.replace("│ ", "").replace(" │", "")
    assert "│ allreduce  allreduce not timed (the allreduce probe failed" in screen
    assert "│ pareto     1 config(s) on the samples/s-samples/J front (trial-0)" in screen
    assert "│ note" in screen and "collectives on gloo: 2 ranks share the host" in screen


def test_the_live_view_has_no_findings_panel_when_nothing_was_found(tmp_path):
    Journal(tmp_path).emit(Event.RUN_STARTED, kind="tune", command=["a.py"], cwd=".")
    assert "findings" not in screen_of(tmp_path)


def test_the_report_shows_what_the_plain_lines_show(tmp_path):
    page = html.build_html(findings_run(tmp_path))
    for said in (PAYBACK, MEMORY, BATCH, "allreduce not timed (the allreduce probe failed",
                 "collectives on gloo: 2 ranks share the host"):
        assert html.escape(said) in page, said
    assert "<h2>Findings</h2>" in page and "<h2>Memory by batch size</h2>" in page
    confirm = re.search(r"<h2>Confirmation</h2>.*?</table>", page, re.S)
    assert confirm and "crashed: exit code 1" in confirm.group(0)
    assert "<code>batch_size=128</code>" in confirm.group(0)


# -- docs/internals.md ------------------------------------------------------------------------
def doc_table() -> dict[str, tuple[set, set]]:
    """event -> (required, optional) as the "Journal events" table of docs/internals.md has it."""
    doc = (ROOT / "docs" / "internals.md").read_text()
    section = doc[doc.index("## Journal events"):]
    section = section[:section.find("\n## ", 4)] if "\n## " in section[4:] else section
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        names = [re.findall(r"`([^`]+)`", c) for c in cells[:3]]
        assert len(names[0]) == 1, line
        rows[names[0][0]] = (set(names[1]), set(names[2]))
    return rows


def test_the_docs_table_names_every_event_and_exactly_its_fields():
    table = doc_table()
    assert set(table) == {e.value for e in Event}
    for event, spec in FIELDS.items():
        assert table[event.value] == (set(spec.required), set(spec.optional)), event


# -- knobs as text ---------------------------------------------------------------------------
def test_a_config_reads_one_way_everywhere():
    assert knobs_text({"batch_size": 64, "workers": 2}) == "batch_size=64 workers=2"
    assert knobs_text({"bucket_mb": 25.0, "thread_pct": 50}) == "bucket_mb=25 thread_pct=50"
    assert knobs_text({}) == knobs_text(None) == "(script defaults)"


def test_no_module_formats_knobs_by_hand():
    by_hand = re.compile(r"""f["']\{k\}=\{\w+\}["'] for k, v in [\w.]*(knobs|cfg)\w*\.items""")
    offenders = [str(f.relative_to(ROOT)) for f in sorted((ROOT / "autotune").rglob("*.py"))
                 if by_hand.search(f.read_text())]
    assert offenders == []


def _event_compares(tree):
    """Line numbers where an event's name is compared with a string: ``e["event"] == "x"``."""
    def names_event(node):
        if isinstance(node, ast.Subscript):
            return isinstance(node.slice, ast.Constant) and node.slice.value == "event"
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get" and node.args
                and isinstance(node.args[0], ast.Constant) and node.args[0].value == "event")

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(names_event(n) for n in sides) and \
                    any(isinstance(n, ast.Constant) and isinstance(n.value, str) for n in sides):
                yield node.lineno


def test_readers_compare_event_names_with_the_enum_never_with_a_string():
    spelled = [f"{f.relative_to(ROOT)}" for f in sorted((ROOT / "autotune").rglob("*.py"))
               for _ in _event_compares(ast.parse(f.read_text()))]
    assert spelled == []


def test_journal_file_name_unchanged():
    assert EVENTS == "events.jsonl"


def test_a_tuning_run_journals_its_findings_within_the_schema(tmp_path, machine):
    """The writers of `payback` and `memory_fit` build their fields from records (`Payback`,
    `MemoryFit`): the journal refuses them if those records drift from the schema."""
    import dataclasses

    from conftest import journal
    from test_study import FakeProbe, surface, tune

    class Measured(FakeProbe):  # the script's dataset is known; memory grows with the batch
        def __call__(self, spec, **kw):
            r = super().__call__(spec, **kw)
            batch = int(spec.ranks.knobs.get("batch_size", 32))
            return dataclasses.replace(r, seen={**r.seen, "dataset_len": 50_000},
                                       ranks_seen=spec.ranks.instances,
                                       peak_rss_bytes=(2**27 + batch * 2**20)
                                       * spec.ranks.instances)

    report, _, run_dir = tune(tmp_path, Measured(surface), command=("train.py", "--epochs", "20"),
                              trials=4, confirm_rounds=0)
    (paid,), (fit,) = journal(run_dir, Event.PAYBACK), journal(run_dir, Event.MEMORY_FIT)
    assert paid["text"] == report.payback.text() and fit["text"] == report.memory.text
    lines = [text.event_line(e) for e in journal(run_dir)]
    assert f"payback: {paid['text']}" in lines and f"memory: {fit['text']}" in lines


def test_a_batch_change_is_said_once_in_each_stream(tmp_path, machine):
    """The winner changes the job's global batch: the journal carries it once (the event), the
    summary once (its field, not again among the notes), and the tuning's live notes not at
    all (the live view shows the event)."""
    from conftest import journal
    from test_study import FakeProbe, tune

    told = []
    report, t, run_dir = tune(tmp_path, FakeProbe(lambda k: 10.0 * k["batch_size"]), trials=6,
                              fix_tokens=("workers=0", "threads=2"), confirm_rounds=2,
                              notify=told.append)
    assert report.batch_note, "the fake favours the largest batch: the winner changes it"
    assert [e["text"] for e in journal(run_dir, Event.BATCH_CHANGE)] == [report.batch_note]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["batch_note"] == report.batch_note
    assert not [n for n in summary["notes"] if "global batch" in n]
    assert told and not [n for n in told if "global batch" in n.text]


def test_a_live_estimate_that_says_nothing_new_is_not_written(tmp_path):
    """A probe whose count stands still (a rank waiting on a lost node) gives the same
    estimate each second: one ``trial_progress`` says it, not one a second."""
    from autotune.measuring.steady import Estimate
    from autotune.measuring.trial_events import TrialEvents
    from autotune.store.journal import Journal, read_events

    told = TrialEvents(Journal(tmp_path), "probe-full", None, "full")
    still = Estimate(569.4, 19.9, 2.0, 1.0, 0.0, 4)
    for est in (still, still, still, Estimate(571.0, 12.0, 3.0, 1.0, 0.0, 6), still):
        told.progress(est)
    events, _ = read_events(tmp_path)
    assert [e["samples_per_s"] for e in events if e["event"] == "trial_progress"] == \
        [569.4, 571.0, 569.4]
