"""What every step is given: the paths, the marker its processes carry, the settings, and the
facts the env step found (which gate the other steps)."""

from __future__ import annotations

import itertools
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from gpuproof import procs

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "cuda_small" / "train.py"


def root_first(env) -> dict[str, str]:
    """A copy of ``env`` with this checkout first on ``PYTHONPATH``: ``python -m autotune``
    finds it from any directory, installed or not (a lent GPU host does not install it)."""
    out = dict(env)
    path = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(ROOT)]
    out["PYTHONPATH"] = os.pathsep.join([str(ROOT), *path])
    return out


@dataclass(frozen=True)
class Settings:
    """The kit's options, parsed once."""

    budget: str = "4m"
    energy_budget: str = "3m"  # the energy step's tune --objective throughput,energy
    foreign_limit: float | None = None  # tune --foreign-limit CORES; None: autotune's default
    tune_space: tuple[str, ...] = ()  # autotune tune --space tokens; () = the default space
    probe_seconds: float = 20.0
    seconds: float = 30.0
    rounds: int = 2
    instances: tuple[int, ...] = (2, 3, 4)
    time_sliced: tuple[int, ...] | None = None  # None: the largest count with MPS, all without
    gpu: int = 0
    script: Path = EXAMPLE
    script_args: tuple[str, ...] = ()
    allow_cpu: bool = False
    mps_start_timeout_s: float = 15.0


@dataclass
class Context:
    out: Path
    work: Path
    settings: Settings
    marker: str
    python: str = sys.executable
    facts: dict = field(default_factory=dict)  # the env step's data
    _count: itertools.count = field(default_factory=itertools.count)

    def env(self, **extra: str) -> dict[str, str]:
        """A child's environment: ours, the repo root first on ``PYTHONPATH`` (autotune need not
        be installed), the marker, and ``extra``."""
        env = root_first(os.environ)
        env[procs.MARKER_ENV] = self.marker
        env["PYTHONUNBUFFERED"] = "1"
        env.update(extra)
        return env

    def log(self, name: str) -> Path:
        """A fresh log file path under the work dir."""
        return self.work / "logs" / f"{next(self._count):03d}-{name}.log"

    def autotune_env(self) -> tuple[dict[str, str], Path]:
        """Environment for an autotune command: its runs, and its MPS daemons in a short
        directory of ours that is kept (``AUTOTUNE_MPS_KEEP``) so the kit can read control.log."""
        mps_dir = Path(tempfile.mkdtemp(prefix="gpat", dir="/tmp"))
        return self.env(AUTOTUNE_RUNS_DIR=str(self.work / "runs"), AUTOTUNE_MPS_DIR=str(mps_dir),
                        AUTOTUNE_MPS_KEEP="1"), mps_dir

    def autotune(self, *args: str, name: str, timeout_s: float, env=None) -> procs.Ran:
        """``python -m autotune ARGS`` from the repo root, as a user runs it (``env``: from
        `autotune_env` for a command that may start MPS daemons)."""
        if env is None:
            env = self.env(AUTOTUNE_RUNS_DIR=str(self.work / "runs"))
        return procs.run([self.python, "-m", "autotune", *args], env=env, cwd=str(ROOT),
                         timeout_s=timeout_s, log_path=self.log(name))

    def gate(self) -> str:
        """Why the GPU steps cannot run here ('' when they can)."""
        torch = self.facts.get("torch", {})
        if torch.get("cuda_available") or self.settings.allow_cpu:
            return ""
        if not torch.get("version"):
            return f"torch is not importable here: {torch.get('why_not')}"
        return (f"no CUDA torch: torch {torch['version']} (CUDA {torch.get('cuda') or 'none'}) "
                f"sees no GPU")
