"""Tuning that pays for itself: the run's length from the script's arguments, the budget as a
share of it, and tuning's cost against the winner's projected saving."""

import dataclasses

import pytest

from autotune.launching import script_flags
from autotune.tuning import payback
from conftest import journal
from test_study import FakeProbe, machine, surface, tune  # noqa: F401 - a fixture


@pytest.mark.parametrize("args, want", [
    (["--epochs", "90", "--lr", "0.1"], {"epochs": (90, "--epochs 90")}),
    (["--trainer.max_iters=5000", "-b", "32"], {"steps": (5000, "--trainer.max_iters=5000")}),
    (["--num_train_epochs", "3", "--max_steps", "{steps}"], {"epochs": (3, "--num_train_epochs 3")}),
    (["--epochs", "0", "--", "--epochs", "7"], {}),
])
def test_the_run_s_length_is_read_from_the_script_s_own_flags(args, want):
    assert script_flags.run_length(args) == want


def test_epochs_over_the_dataset_or_steps_over_the_global_batch():
    run = payback.project(["--epochs", "3"], {"dataset_len": 50_000}, 32)
    assert run.samples == 150_000 and run.how == "--epochs 3 x 50,000 samples"
    assert payback.project(["--epochs", "3"], {}, 32) is None  # an epoch of unknown length
    steps = payback.project(["--max_steps", "1000"], {}, 64)
    assert steps.samples == 64_000 and steps.seconds_at(100.0) == 640.0
    assert payback.project([], {"dataset_len": 10}, 32) is None


def test_the_budget_is_a_share_of_the_run_capped_never_more_than_the_run():
    assert payback.budget_for(2 * 3600) == pytest.approx(720.0)  # 10% of 2 h
    assert payback.budget_for(3 * 3600) == payback.MAX_BUDGET_S == 900  # 18m: capped at 15
    assert payback.budget_for(90 * 3600) == payback.MAX_BUDGET_S  # --epochs 90 of a real job
    assert payback.budget_for(1000) == payback.MIN_BUDGET_S  # 10% would hold too little
    assert payback.budget_for(60) == 60  # a one-minute run: never more than the run


@pytest.mark.parametrize("run_s, want", [
    (2 * 3600, "tuning budget 12m: 10% of the projected run (2h 00m); --budget TIME sets "
               "another"),
    (90 * 3600, "tuning budget 15m: 10% of the projected run (90h 00m) is 9h 00m, capped at "
                "15m; --budget TIME sets another"),
    (1000, "tuning budget 3m: 10% of the projected run (16m 40s) is 1m 40s, raised to the "
           "least, 3m; --budget TIME sets another"),
    (60, "tuning budget 1m, the whole projected run: a run this short cannot pay for tuning; "
         "--budget TIME or --trials N tunes anyway"),
])
def test_the_default_budget_says_where_it_came_from_and_how_to_change_it(run_s, want):
    assert payback.budget_text(payback.budget_for(run_s), run_s) == want


def test_the_defaults_are_said_before_the_baseline():
    text = payback.default_text(20)
    assert text == ("no --budget: once the baseline has run, tuning takes 10% of the full run "
                    "when the script's arguments give its length (--epochs, --max-steps; at "
                    "least 3m, at most 15m), else 20 probes; --budget TIME sets one")


def test_the_help_of_trials_and_budget_says_what_happens():
    from autotune.commands.cli import build_parser

    parser = build_parser()
    for command in ("tune", "wrap"):
        sub = parser._subparsers._group_actions[0].choices[command]
        helps = {a.dest: a.help for a in sub._actions}
        assert "20 without --budget" not in helps["trials"]
        assert "20 when the script's arguments do not give the run's length" in helps["trials"]
        assert "--trials alone sets no time limit" in helps["trials"]
        assert "10%% of the full run" in helps["budget"]  # argparse's escape for %
        assert "at least 3m and at most 15m" in helps["budget"]


def test_the_payback_says_cost_and_saving():
    p = payback.payback(300, payback.RunLength(720_000, "--epochs 90 x 8,000 samples"),
                        100.0, 160.0)
    assert p.baseline_run_s == 7200 and p.best_run_s == 4500 and p.saving_s == 2700
    assert p.text() == ("tuning cost 5m 00s, projected saving 45m 00s over the run (--epochs 90 "
                        "x 8,000 samples: 2h 00m at the script's own settings, 1h 15m with the "
                        "winner): tuning pays for itself")
    assert "does not pay for itself" in payback.payback(
        3000, p.run, 100.0, 101.0).text()


class KnownDataset(FakeProbe):
    """The script's DataLoader holds ``size`` samples (50,000)."""

    size = 50_000

    def __call__(self, spec, **kw):
        r = super().__call__(spec, **kw)
        return dataclasses.replace(r, seen={**r.seen, "dataset_len": self.size})


class SmallDataset(KnownDataset):
    size = 5_000


def test_without_a_budget_tuning_takes_its_share_of_the_projected_run(tmp_path, machine):
    report, t, run_dir = tune(tmp_path, KnownDataset(surface),
                              command=("train.py", "--epochs", "20"), confirm_rounds=1)
    base = report.baseline.samples_per_s
    run_s = 20 * 50_000 / base
    assert t.state.settings.budget_s == pytest.approx(payback.budget_for(run_s))
    assert any("the full run: --epochs 20 x 50,000 samples" in n.text for n in report.notes)
    assert any("tuning budget" in n.text and "10% of the projected run" in n.text for n in report.notes)
    # said before the baseline, with how to set another
    assert report.notes[0].text == payback.default_text(20), report.notes[0]
    p = report.payback
    assert p.baseline_run_s == pytest.approx(run_s)
    assert p.best_run_s == pytest.approx(1_000_000 / report.best.samples_per_s)
    assert "projected saving" in p.text() and journal(run_dir, "payback")[0]["text"] == p.text()
    assert payback.Payback.from_dict(p.to_dict()) == p


def test_a_given_budget_or_trials_stays_and_an_unknown_run_tells_no_payback(tmp_path, machine):
    report, t, _ = tune(tmp_path / "a", KnownDataset(surface),
                        command=("train.py", "--epochs", "20"), trials=4, confirm_rounds=0)
    assert t.state.settings.budget_s is None and report.payback is not None
    assert not any(n.text.startswith("no --budget") for n in report.notes)
    report, t, _ = tune(tmp_path / "b", FakeProbe(surface), trials=4, confirm_rounds=0)
    assert report.payback is None


def test_a_run_shorter_than_tuning_could_pay_for_is_told(tmp_path, machine):
    report, t, _ = tune(tmp_path, SmallDataset(surface), command=("train.py", "--epochs", "1"),
                        confirm_rounds=0)
    run_s = 5_000 / report.baseline.samples_per_s  # under 3 minutes
    assert t.state.settings.budget_s == pytest.approx(run_s)
    assert any("a run this short cannot pay for tuning" in n.text for n in report.notes)
