"""The study's trial attributes: one typed record, its schema checked on write and on read."""

import pytest

from autotune.measuring.outcome import Outcome
from autotune.tuning import study as studies
from autotune.tuning.trial_attrs import SCHEMA, TrialAttrs, check


def test_a_record_writes_only_what_it_was_given_under_the_names_studies_use():
    attrs = TrialAttrs(run="r-1", knobs={"batch_size": 32}, outcome=Outcome.OOM, not_tried=True,
                       samples_per_s=0.0, duplicate_of=0)
    assert attrs.to_attrs() == {"run": "r-1", "knobs": {"batch_size": 32}, "outcome": "oom",
                                "not_tried": True, "samples_per_s": 0.0, "duplicate_of": 0}
    assert TrialAttrs().to_attrs() == {}
    assert TrialAttrs.of(attrs.to_attrs()) == attrs


def test_every_field_is_in_the_schema():
    assert set(TrialAttrs.__dataclass_fields__) == set(SCHEMA)


@pytest.mark.parametrize("attrs, says", [
    ({"knobs": {"batch_size": 8}, "colour": "red"}, "colour"),
    ({"samples_per_s": "fast"}, "samples_per_s='fast'"),
    ({"baseline": 1}, "baseline=1"),
    ({"retry_of": True}, "retry_of=True"),
])
def test_a_write_outside_the_schema_is_refused(attrs, says):
    with pytest.raises(ValueError, match=says):
        check(attrs)


def test_a_read_takes_only_what_it_knows_each_of_its_type():
    read = TrialAttrs.of({"knobs": {"batch_size": 8}, "ci_half": "wide", "colour": "red",
                          "outcome": "no-such-outcome", "probe_s": 12})
    assert read == TrialAttrs(knobs={"batch_size": 8}, probe_s=12)


@pytest.mark.parametrize("tag, outcome, not_tried", [
    ("failed", Outcome.CRASHED, False), ("oom-skipped", Outcome.OOM, True),
    ("ok", Outcome.OK, False)])
def test_outcome_tags_of_earlier_studies_read_once(tag, outcome, not_tried):
    read = TrialAttrs.of({"outcome": tag})
    assert read.outcome is outcome and read.not_tried is not_tried


def test_a_live_trial_records_the_checked_record(tmp_path):
    h = studies.open_study(studies.sqlite_url(tmp_path / "study.db"), "s", run_id="r")
    trial = h.study.ask()
    studies.write(trial, TrialAttrs(run="r", knobs={"batch_size": 16}, probe_s=3.5))
    with pytest.raises(ValueError):
        studies.write(trial, TrialAttrs(probe_s="long"))
    h.study.tell(trial, 1.0)
    (t,) = h.trials()
    assert t.user_attrs == {"run": "r", "knobs": {"batch_size": 16}, "probe_s": 3.5}
    assert studies.attrs_of(t) == TrialAttrs(run="r", knobs={"batch_size": 16}, probe_s=3.5)
