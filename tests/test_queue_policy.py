"""The search's queueing policy, as pure rules over a space and the answers so far."""

import pytest

from autotune.measuring.outcome import Outcome
from autotune.tuning import objective, queue_policy, space
from autotune.tuning.records import Known

GIB = 2**30
SP = space.build(space.Machine(cores=2, mem_available_bytes=16 * GIB),
                 space.Baseline(batch_size=32, workers=0, peak_rss_bytes=GIB // 2),
                 space.SpaceRequest(ranges=space.parse_space(("batch_size=8:128", "workers=0:2")),
                                    fixed=space.parse_fix(("threads=2",)), global_batch=None,
                                    placeholders=(), devices=1))
SCORER = objective.Scorer(objective.THROUGHPUT)


def score(k):
    return SCORER.score(k.value, k.ci_half, k.cfg, k.energy)


def cfg(batch=32, workers=0):
    return SP.config({**SP.baseline, "batch_size": batch, "workers": workers})


def answered(*rows):
    """``(batch, workers, samples/s[, outcome])`` rows as the search's `known`."""
    out = {}
    for i, (batch, workers, rate, *outcome) in enumerate(rows):
        c = cfg(batch, workers)
        out[SP.key(c)] = Known(i, outcome[0] if outcome else Outcome.OK, rate, 2.0, c)
    return out


def test_the_smaller_batch_neighbour_waits_for_the_larger():
    smaller, larger = queue_policy.neighbours(SP)
    assert (smaller["batch_size"], larger["batch_size"]) == (16, 32 * 2)
    start = queue_policy.start(SP, None)
    queued = [q.cfg["batch_size"] for q in start.queued]
    assert 16 not in queued and 64 in queued
    assert any("held back until" in n for n in start.notes)


@pytest.mark.parametrize("larger_rate, queued, says", [
    (150.0, False, "stays held back"),  # +50%: beyond what processes differ by
    (101.0, True, "read +1.0%"),  # within it: the smaller is worth a look
])
def test_the_smaller_is_released_when_the_larger_did_not_pay(larger_rate, queued, says):
    known = answered((32, 0, 100.0), (64, 0, larger_rate))
    settle = queue_policy.release_smaller(SP, None, known, [], score, margin_rel=0.05,
                                          in_study=set)
    assert (settle.queued is not None) is queued and says in settle.note
    assert queue_policy.release_smaller(SP, None, answered((32, 0, 100.0)), [], score,
                                        margin_rel=0.05, in_study=set) is None  # not yet


def test_the_walk_goes_on_the_way_the_batch_paid_and_stops_at_an_oom():
    known = answered((32, 0, 100.0), (64, 0, 130.0), (16, 0, 80.0))
    q = queue_policy.walk(SP, known, [], score, rates=False, blocked=lambda b: False)
    assert q.cfg["batch_size"] == 128 and q.design == "batch-walk" and "one step" in q.note
    assert queue_policy.walk(SP, known, [cfg(128)], score, rates=False,
                             blocked=lambda b: False) is None


def test_the_moves_that_paid_are_joined_once_every_move_is_answered():
    assert queue_policy.combine(SP, answered((32, 0, 100.0), (64, 0, 130.0)), [], score) == \
        (False, None)
    known = answered((32, 0, 100.0), (64, 0, 130.0), (16, 0, 80.0), (32, 2, 120.0))
    done, q = queue_policy.combine(SP, known, [], score)
    assert done and q.design == "combined" and (q.cfg["batch_size"], q.cfg["workers"]) == (64, 2)


def test_a_move_pruned_against_a_lucky_baseline_is_queued_again_once():
    known = answered((32, 0, 100.0), (64, 0, 97.0, Outcome.PRUNED), (16, 0, 40.0, Outcome.PRUNED))
    again = queue_policy.misjudged(SP, known, score, floor=98.0, margin_rel=0.05, counts={},
                                   waiting=set())
    assert [q.cfg["batch_size"] for q in again] == [64] and again[0].design == "again"
    twice = {SP.key(cfg(64)): 2}
    assert queue_policy.misjudged(SP, known, score, floor=98.0, margin_rel=0.05, counts=twice,
                                  waiting=set()) == []


def test_a_second_look_takes_the_pruned_config_nearest_the_bar_that_fits_once():
    """The bar: a floor of 100 less a 3% margin, 97. Pruned: batch 64 at 80 ± 2 (18% under
    it), 16 at 70 ± 2 (28% under: past `SECOND_LOOK_REL`), 8 at 60 ± 2; measured: 128 at 90.
    Replays of a config (`StudyQueue.counts` leaves them out) do not count as measurements."""
    known = answered((32, 0, 102.0), (64, 0, 80.0, Outcome.PRUNED),
                     (16, 0, 70.0, Outcome.PRUNED), (8, 0, 60.0, Outcome.PRUNED),
                     (128, 0, 90.0))

    def look(counts=None, fits=lambda c: True, floor=100.0):
        return queue_policy.second_look(SP, known, score, floor=floor, margin_rel=0.03,
                                        counts=counts or {}, fits=fits)

    q = look()
    assert q.cfg["batch_size"] == 64 and q.design == "again" and "18% under" in q.note
    # probed twice already, or its probe does not fit: none of the others is near enough
    assert look(counts={SP.key(cfg(64)): 2}) is None
    assert look(fits=lambda c: c["batch_size"] != 64) is None
    # a lower bar brings 16 within reach; 64 stays the nearest, and where it has had its
    # second look, 16 is next
    assert look(floor=85.0).cfg["batch_size"] == 64
    assert look(floor=85.0, counts={SP.key(cfg(64)): 2}).cfg["batch_size"] == 16
    assert look(floor=None) is None  # no bar yet: nothing was pruned against one
