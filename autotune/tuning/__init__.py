"""Tuning runs: baseline, Optuna search and confirmation, resumable from their run directory.

    report = Tuner(TuneState.new(TuneSettings(command=..., cwd=...), run_dir), run_dir,
                   journal).run()
"""

from __future__ import annotations

from autotune.tuning.prober import Prober
from autotune.tuning.records import DEFAULT_TRIALS, Known, Scored, TuneReport, TuneSettings
from autotune.tuning.state import TuneState, check_not_running, load_state
from autotune.tuning.tuner import Tuner

__all__ = ["DEFAULT_TRIALS", "Known", "Prober", "Scored", "TuneReport", "TuneSettings",
           "TuneState", "Tuner", "check_not_running", "load_state"]
