"""Shared fixtures: paths to the tiny scripts, a private runs dir, and a leftover-process check."""

import os
import sys
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "tests" / "scripts"
EXAMPLES = ROOT / "examples"


@pytest.fixture(autouse=True)
def _private_runs_dir(tmp_path, monkeypatch):
    """Every test writes its run directories under its own tmp dir, never in ~."""
    monkeypatch.setenv("AUTOTUNE_RUNS_DIR", str(tmp_path / "runs"))


def trial_processes(prefix: str) -> list[psutil.Process]:
    """Live processes of ours whose AUTOTUNE_TRIAL marker starts with ``prefix``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid == os.getpid():
                continue
            marker = proc.environ().get("AUTOTUNE_TRIAL", "")
            if marker.startswith(prefix) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def live_children() -> list[psutil.Process]:
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                out.append(child)
        except psutil.Error:
            continue
    return out


@pytest.fixture
def python():
    return sys.executable
