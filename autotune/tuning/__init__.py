"""Tuning runs: baseline, Optuna search and confirmation, resumable from their run directory.

    report = Tuner(TuneState.new(TuneSettings(command=..., cwd=...), run_dir), run_dir,
                   journal).run()

The names below load on first use: `autotune.tuning.space` (the knobs, their text) is read by
the monitor and `autotune env`, which must work without Optuna.
"""

from __future__ import annotations

import importlib

_HOME = {"Prober": "prober", "DEFAULT_TRIALS": "records", "Known": "records",
         "Scored": "records", "TuneReport": "records", "TuneSettings": "records",
         "TuneState": "state", "check_not_running": "state", "load_state": "state",
         "Tuner": "tuner"}

__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name in _HOME:
        return getattr(importlib.import_module(f"autotune.tuning.{_HOME[name]}"), name)
    raise AttributeError(f"module 'autotune.tuning' has no attribute {name!r}")
