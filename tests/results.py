"""Hand-built `TrialResult`s for tests that fake a probe: one measured probe with plain values,
changed by keyword. With ``spec`` it is that spec's probe (its log, knobs, mode, limit)."""

from autotune.measuring.outcome import Outcome
from autotune.measuring.result import TrialResult
from probes.protocol import Mode


def trial_result(spec=None, **over) -> TrialResult:
    fields = dict(outcome=Outcome.OK, reason="", samples_per_s=100.0, ci_half=2.0,
                  source="dataloader", steps_per_s=6.0, measured_s=5.0, warmup_s=1.0,
                  paused_s=0.0, duration_s=8.0, peak_rss_bytes=2**28, cuda_peak_bytes=0,
                  foreign_cores=0.0, exit_code=0, log_path="/x/trial.log", log_tail="", seen={},
                  knobs={}, mode=Mode.FULL, stopped=True)
    if spec is not None:
        fields.update(log_path=str(spec.ranks.log_dir / f"{spec.ranks.name}.log"),
                      knobs=dict(spec.ranks.knobs), mode=spec.ranks.mode,
                      foreign_limit_cores=spec.foreign_limit_cores)
    return TrialResult(**{**fields, **over})
