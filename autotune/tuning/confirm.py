"""The end of a tuning run: confirm the best configs against the baseline, then declare a winner.

The best two configs of the search and the baseline are re-measured in separate processes,
interleaved (A B C A B C), with longer probes than the search's. Variance lives between
processes more than within one, so this, not a longer single window, is what makes the decision
robust; `autotune.tuning.decision.decide` keeps the baseline unless the gain is real.
"""

from __future__ import annotations


from autotune.tuning import decision
from autotune.store import jsontext, rundir
from autotune.measuring import bottleneck
from autotune.tuning.decision import Measured

CONFIRM_TARGET_REL = 0.02  # tight enough that a confirmation probe measures its whole window


def _candidates(tuner) -> list[tuple[str, dict]]:
    sp = tuner.space
    base_key = sp.key(sp.baseline)
    oks = sorted((k for k in tuner.known.values()
                  if k.outcome == "ok" and sp.key(k.cfg) != base_key),
                 key=lambda k: -k.value)[:2]
    return [("baseline", dict(sp.baseline))] + [(f"trial-{k.number}", dict(k.cfg)) for k in oks]


def fit(rounds: int, window_s: float, configs: int, left_s: float | None,
        least_s: float) -> tuple[int, float]:
    """Rounds and probe length that fit ``left_s`` of the budget (None: no budget); at least
    one round of probes as long as the search's (``least_s``)."""
    if left_s is None or rounds * configs * window_s <= left_s:
        return rounds, window_s
    rounds = max(1, min(rounds, int(left_s // (configs * window_s))))
    if rounds * configs * window_s > left_s:
        window_s = max(least_s, left_s / (rounds * configs))
    return rounds, window_s


def _remeasure(tuner, entries, rounds: int, window_s: float) -> dict[str, list]:
    cfgs = dict(entries)
    results: dict[str, list] = {name: [] for name in cfgs}
    for rnd, name in decision.interleave(list(cfgs), rounds):
        cfg = cfgs[name]
        spec = tuner.spec(cfg, f"confirm{rnd}-{name}", max_s=window_s,
                           min_measure_s=0.6 * window_s, target_rel=CONFIRM_TARGET_REL)
        r = tuner.probe(spec, label=f"confirm{rnd}-{name}", number=None, cfg=cfg, events=False)
        results[name].append(Measured(r.samples_per_s, r.ci_half) if r.ok else None)
        tuner.journal.emit("confirmation", round=rnd, trial=name, knobs=cfg,
                           samples_per_s=r.samples_per_s if r.ok else None,
                           ci_half=r.ci_half if r.ok else None, outcome=r.outcome.value,
                           reason=r.reason)
        if not r.ok:
            tuner.notify("warning", f"confirmation round {rnd}, {name}: {r.outcome.value}: "
                                    f"{r.reason}")
    return results


def _probe_verdict(tuner, cfg: dict, full: float) -> dict:
    rates = {}
    for mode in ("synthetic", "io"):
        label = f"verdict-{mode}"
        r = tuner.probe(tuner.spec(cfg, label, mode=mode), label=label, number=None, cfg=cfg)
        rates[mode] = r.samples_per_s if r.ok else None
    v = bottleneck.decide(full, rates["synthetic"], rates["io"])
    out = {"bottleneck": v.bottleneck, "bound_samples_per_s": v.bound_samples_per_s,
           "full_share_of_bound": v.full_share_of_bound, "text": v.text}
    tuner.journal.emit("probe_verdict", verdict=out)
    return out


def finish(tuner, handle):
    """Confirm, decide, record; returns the run's `TuneReport`."""
    from autotune.tuning.records import Scored, TuneReport

    entries = _candidates(tuner)
    names = [n for n, _ in entries]
    cfgs = dict(entries)
    rounds = tuner.s.confirm_rounds
    if len(entries) > 1 and rounds > 0:
        left = tuner.s.budget_s - tuner.elapsed() if tuner.s.budget_s is not None else None
        rounds, window_s = fit(rounds, tuner.s.confirm_probe_s, len(entries), left,
                               tuner.s.seconds)
        tuner.notify("info", f"confirming: {', '.join(names)}, {rounds} interleaved round(s) of "
                             f"{window_s:.0f} s probes")
        results = _remeasure(tuner, entries, rounds, window_s)
    else:
        # No re-measurement: the search's own probes, one round each.
        base = tuner.baseline
        results = {"baseline": [Measured(base.samples_per_s, base.ci_half)]}
        for name, cfg in entries[1:]:
            k = tuner.known[tuner.space.key(cfg)]
            results[name] = [Measured(k.value, k.ci_half)]
    d = decision.decide(results, "baseline")
    if len(entries) == 1:
        d = decision.Decision("baseline", True, 1.0, d.baseline_summary, d.baseline_summary, 0.0,
                            "kept the script's defaults: no other config completed a probe")
    best_cfg = cfgs[d.winner]
    best = Scored(best_cfg, d.winner_summary.samples_per_s, d.winner_summary.ci_half)
    baseline = Scored(cfgs["baseline"], d.baseline_summary.samples_per_s,
                      d.baseline_summary.ci_half)
    tuner.notify("info", d.reason)
    verdict_info = None
    if tuner.s.verdict:
        verdict_info = _probe_verdict(tuner, best_cfg, best.samples_per_s)
    tuner.journal.emit("best", knobs=best_cfg, samples_per_s=best.samples_per_s,
                       ci_half=best.ci_half, baseline_samples_per_s=baseline.samples_per_s,
                       speedup=d.speedup, kept_baseline=d.kept_baseline, reason=d.reason)
    trials = [t for t in handle.trials() if t.state.is_finished()]
    report = TuneReport(
        run_dir=tuner.run_dir, space=tuner.space, baseline=baseline, best=best,
        speedup=d.speedup, kept_baseline=d.kept_baseline, reason=d.reason,
        trials_measured=tuner.measured + 1, trials_total=len(trials),
        stop_reason=tuner.stop_reason, source=tuner.source, verdict=verdict_info,
        notes=tuple(tuner.notes))
    rundir.write_atomic(tuner.run_dir / "summary.json",
                        jsontext.dumps(report.to_dict(), indent=2))
    return report
