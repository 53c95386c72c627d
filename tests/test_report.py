"""``autotune report``: one offline HTML file that holds the plots' data and loads nothing remote."""

import json
import re
import shutil
from pathlib import Path

import pytest

from autotune.commands.cli import main
from autotune.report.importance import from_study, from_trials

JOURNALS = Path(__file__).parent / "data" / "journals"
RECIPE = 'schema = 1\n[knobs]\nbatch_size = 192\nworkers = 2\n'


def make_run(tmp_path: Path, journal: str) -> Path:
    run_dir = tmp_path / "runs" / journal
    run_dir.mkdir(parents=True)
    shutil.copy(JOURNALS / f"{journal}.jsonl", run_dir / "events.jsonl")
    return run_dir


def report(run_dir: Path, out: Path) -> str:
    assert main(["report", str(run_dir), "-o", str(out)]) == 0
    return out.read_text()


def embedded_data(html: str) -> dict:
    m = re.search(r"<script type='application/json' id='autotune-data'>(.*?)</script>", html,
                  re.S)
    assert m, "no embedded data block"
    return json.loads(m.group(1))


def assert_offline(html: str) -> None:
    lowered = html.lower()
    assert "http://" not in lowered and "https://" not in lowered
    assert not re.search(r"<script[^>]*\bsrc\s*=", lowered)
    assert not re.search(r"<(link|img|iframe|object|embed)\b", lowered)
    assert "url(" not in lowered and "@import" not in lowered
    # the only script element is inert data
    assert re.findall(r"<script[^>]*>", lowered) == [
        "<script type='application/json' id='autotune-data'>"]


def points(html: str, chart: str) -> list[tuple[str, str, str]]:
    """(x, y, kind) of every mark of one chart."""
    m = re.search(rf'<svg class="chart" data-chart="{re.escape(chart)}".*?</svg>', html, re.S)
    assert m, f"chart {chart!r} missing"
    return re.findall(r'data-x="([^"]*)" data-y="([^"]*)" data-kind="([^"]*)"', m.group(0))


@pytest.fixture
def mixed_html(tmp_path, monkeypatch):
    run_dir = make_run(tmp_path, "tune_mixed")
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "train-cpu2.toml").write_text(RECIPE)
    monkeypatch.chdir(tmp_path)  # the journal names the recipe relative to where tune ran
    return report(run_dir, tmp_path / "out" / "r.html")


def test_history_chart_holds_every_trial_with_its_outcome(mixed_html):
    marks = points(mixed_html, "history")
    assert marks == [("0", "212.4", "ok"), ("1", "301.7", "ok"), ("2", "", "failed"),
                     ("3", "265.0", "ok"), ("4", "120.3", "pruned"), ("5", "", "failed"),
                     ("6", "318.9", "best")]
    assert 'class="best-so-far"' in mixed_html


def test_one_chart_per_knob_with_the_knob_values(mixed_html):
    batch = points(mixed_html, "knob:batch_size")
    assert [(x, y) for x, y, _ in batch] == [("32", "212.4"), ("128", "301.7"), ("512", ""),
                                             ("64", "265.0"), ("16", "120.3"), ("256", ""),
                                             ("192", "318.9")]
    workers = points(mixed_html, "knob:workers")
    assert sorted({x for x, _, _ in workers}) == ["0", "1", "2", "3", "4"]


def test_importance_best_recipe_and_trials_table(mixed_html):
    data = embedded_data(mixed_html)
    assert set(data["importance"]) == {"batch_size", "workers"}
    assert sum(data["importance"].values()) == pytest.approx(1.0)
    assert 'data-chart="importance"' in mixed_html
    assert "1.506x" in mixed_html and "210.9 samples/s" in mixed_html
    assert "<pre class='recipe'>" + RECIPE in mixed_html
    assert "out of memory: RuntimeError: DefaultCPUAllocator: can&#x27;t allocate memory" \
        in mixed_html
    assert "interval 100.2-140.4 cannot reach the best 301.7" in mixed_html
    assert re.search(r"<tr class='best'><td>#6</td>", mixed_html)
    assert [t["outcome"] for t in data["trials"]] == [
        "ok", "ok", "oom", "ok", "pruned", "crashed", "ok"]
    assert len(data["fullrun"]) == 12


def test_report_is_self_contained(mixed_html):
    assert_offline(mixed_html)
    assert mixed_html.startswith("<!DOCTYPE html>") and mixed_html.rstrip().endswith("</html>")


def test_probe_report_has_mode_bars_and_verdict(tmp_path):
    html = report(make_run(tmp_path, "probe_io_bound"), tmp_path / "p.html")
    bars = re.findall(r'class="bar" data-label="(\w+)" data-value="([\d.]+)"', html)
    assert bars == [("full", "180.2"), ("synthetic", "420.7"), ("io", "190.3")]
    assert "I/O-bound: the input pipeline delivers 190.3 samples/s" in html
    assert 'data-chart="history"' not in html  # a probe is not a search
    assert_offline(html)


def test_report_goes_into_the_run_dir_by_default_and_latest_run_is_the_default(tmp_path,
                                                                              capsys):
    run_dir = make_run(tmp_path, "tune_2gpu")
    assert main(["report", "--runs-dir", str(tmp_path / "runs")]) == 0
    assert capsys.readouterr().out.strip() == str(run_dir / "report.html")
    html = (run_dir / "report.html").read_text()
    assert "2 x NVIDIA A100-SXM4-40GB" in html
    assert_offline(html)


def test_report_of_a_directory_without_journal_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "has no events.jsonl" in capsys.readouterr().err


def test_importance_from_trials_finds_the_knob_that_matters():
    trials = [({"batch_size": b, "workers": w}, 100.0 + b + (w % 2))
              for b in (16, 32, 64, 128) for w in (0, 1, 2)]
    imp = from_trials(trials)
    assert imp["batch_size"] > 0.9 > imp["workers"]
    assert from_trials(trials[:2]) == {}  # too few to say
    assert from_trials([({"a": 1}, 5.0)] * 4) == {}  # nothing varies


def _study_db(run_dir: Path, *, corrupt: bool = False) -> None:
    db = run_dir / "study.db"
    if corrupt:
        db.write_bytes(b"this is not sqlite")
        return
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{db}",
                                direction="maximize")
    for b in (16, 32, 64, 128, 256):
        for w in (0, 2):
            study.enqueue_trial({"batch_size": b, "workers": w})
    study.optimize(lambda t: t.suggest_int("batch_size", 16, 256, log=True) * 2.0
                   + t.suggest_int("workers", 0, 2) * 0.01, n_trials=10)


def test_importance_comes_from_the_study_when_there_is_one(tmp_path):
    run_dir = make_run(tmp_path, "tune_mixed")
    _study_db(run_dir)
    imp, how = from_study(run_dir)
    assert how.startswith("Optuna") and max(imp, key=imp.get) == "batch_size"
    data = embedded_data(report(run_dir, tmp_path / "r.html"))
    assert data["importance_method"].startswith("Optuna")


def test_a_broken_study_falls_back_to_the_journal(tmp_path):
    run_dir = make_run(tmp_path, "tune_mixed")
    _study_db(run_dir, corrupt=True)
    data = embedded_data(report(run_dir, tmp_path / "r.html"))
    assert data["importance_method"] == "correlation ratio over this run's successful trials"


def test_the_report_shows_where_the_time_goes(tmp_path):
    """A probe whose full mode carried a breakdown: one stacked bar, each part's share."""
    run_dir = make_run(tmp_path, "probe_io_bound")
    shares = {"data": [0.41, 0.05], "forward": [0.35, 0.04], "backward": [0.2, 0.02],
              "comm": [0.0, 0.0], "optimizer": [0.03, 0.0], "other": [0.01, 0.01]}
    lines = []
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        ev = json.loads(line)
        if ev.get("event") == "trial_finished" and ev.get("mode") == "full":
            ev["result"]["breakdown"] = {"shares": shares, "ranks": 1}
        lines.append(json.dumps(ev))
    (run_dir / "events.jsonl").write_text("\n".join(lines) + "\n")
    html = report(run_dir, tmp_path / "p.html")
    parts = re.findall(r'class="part" data-label="full" data-part="([\w ]+)" '
                       r'data-value="([\d.]+)"', html)
    assert parts[0] == ("data wait", "0.4100") and len(parts) == 6
    assert "Where the time goes" in html
    assert "Where the time goes" not in report(make_run(tmp_path / "b", "probe_io_bound"),
                                               tmp_path / "q.html")
    assert_offline(html)


def test_the_best_section_shows_the_claim_and_the_batch_keeping_config():
    from autotune.monitor.state import fold
    from autotune.report.html import best_section

    keep = {"knobs": {"batch_size": 20, "workers": 2}, "samples_per_s": 130.0, "ci_half": 2.0,
            "speedup": 1.3, "speedup_low": 1.1049, "speedup_high": 1.5301,
            "kept_baseline": False, "reason": "batch-keeping alternative: ..."}
    state = fold([{"t": 1.0, "event": "run_started", "kind": "tune", "command": ["t.py"],
                   "cwd": "/"},
                  {"t": 2.0, "event": "best", "knobs": {"batch_size": 160, "workers": 2},
                   "samples_per_s": 160.0, "ci_half": 3.0, "baseline_samples_per_s": 100.0,
                   "speedup": 1.6, "kept_baseline": False, "reason": "trial-3 measured ...",
                   "speedup_low": 1.2999, "speedup_high": 1.9001, "keep_batch": keep,
                   "rounds": 3, "candidates": 3}])
    html = best_section(state)
    assert "1.600x (1.299x-1.901x)" in html  # never rounded up
    assert "keeping the script&#x27;s batch" in html and "1.300x (1.104x-1.531x)" in html
    assert "batch_size=20 workers=2" in html
    kept = fold([{"t": 2.0, "event": "best", **{k: v for k, v in state.best.items()},
                  "keep_batch": {**keep, "kept_baseline": True}}])
    assert "the script&#x27;s defaults (nothing that keeps it" in best_section(kept)
