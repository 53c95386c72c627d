"""Issue 13: nothing computed from no measurement is a reference, a recipe figure or a summary
figure. Fake probes (`test_study.FakeProbe`) flag foreign load where the test says."""

import math

import pytest

from autotune import AutotuneError
import test_study
from conftest import journal
from test_study import FakeProbe, surface, tune, under_load

machine = test_study.machine  # the fixture


class Spoiled(FakeProbe):
    """FakeProbe whose probes named by ``spoils(name)`` run under foreign load (2 cores)."""

    def __init__(self, rate, spoils):
        super().__init__(rate)
        self.spoils = spoils

    def __call__(self, spec, **kw):
        r = super().__call__(spec, **kw)
        return under_load(spec, r, 2.0) if self.spoils(spec.ranks.name) else r


def test_a_confirmation_under_foreign_load_falls_back_to_what_the_search_measured(
        tmp_path, machine):
    fake = Spoiled(surface, lambda name: name.startswith("confirm"))
    report, t, run_dir = tune(tmp_path, fake, trials=5, confirm_rounds=1,
                              fix_tokens=("batch_size=16",))
    base = t.state.baseline
    assert (report.baseline.samples_per_s, report.baseline.ci_half) == \
        (base.samples_per_s, base.ci_half)
    assert report.best.samples_per_s > 0 and math.isfinite(report.best.ci_half)
    assert math.isfinite(report.speedup)
    assert any("using what the search measured" in n.text for n in report.notes)
    best = journal(run_dir, "best")[-1]
    assert best["baseline_samples_per_s"] == base.samples_per_s


def test_a_baseline_still_under_foreign_load_is_never_the_reference(tmp_path, machine):
    fake = Spoiled(surface, lambda name: name == "baseline")
    with pytest.raises(AutotuneError, match="cannot be the reference.*--foreign-limit"):
        tune(tmp_path, fake, trials=5, confirm_rounds=1, foreign_retries=1)
    assert [s.ranks.name for s in fake.specs] == ["baseline", "baseline"]  # re-measured once, no more
    run_dir = tmp_path / "run"
    assert not journal(run_dir, "best") and not (run_dir / "summary.json").exists()
