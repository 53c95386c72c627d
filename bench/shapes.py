"""Third-party training scripts' shapes, as the benches run them, and their own clocks.

One table (`SHAPES`) for bench_claims and bench_search: each shape is a script with the
``{placeholders}`` a user writes for ``autotune tune`` and ``autotune run``, the user's own
values of them (the plain run), tune's ``--baseline`` (the same values), and the regex of the
line where the script prints its own throughput. The regexes are anchored to the script's own
lines: ``autotune run --plain`` prints its meter's figures beside them ("... 51.2 samples/s
..."), which are not the script's.

A script's figure is read from its own output (`own_rate`) after a plain run of a few seconds
(`timed_run`). `plain_run` says what a config of autotune's space is in such a run, set as a
user sets it without autotune: knobs through the placeholders, the thread share through
``OMP_NUM_THREADS``/``MKL_NUM_THREADS``; a knob that only autotune can set (ranks the script
never starts, a DataLoader setting it has no flag for) is refused (`NotPlain`).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from autotune.launching import rank_command  # noqa: E402
from autotune.tuning import space  # noqa: E402

TEST_SCRIPTS = ROOT / "tests" / "scripts"
BENCH_SCRIPTS = ROOT / "bench" / "scripts"
THREAD_VARS = rank_command.THREAD_VARS  # what autotune sets for a rank's thread count


@dataclass(frozen=True)
class Shape:
    """A script as a user runs it, plainly and under autotune."""

    what: str
    script: tuple[str, ...]  # the script and its fixed arguments
    placeholders: tuple[str, ...]  # arguments with {knob} placeholders, for tune and run
    plain_args: tuple[str, ...]  # the same arguments with the user's own values
    baseline: tuple[str, ...]  # tune's --baseline NAME=VALUE: those values again
    rate: re.Pattern  # the script's own throughput line; group 1: samples/s

    def tune_args(self) -> list[str]:
        return ["--baseline", *self.baseline]


SHAPES: dict[str, Shape] = {
    "word_lm": Shape(
        "PyTorch's word_language_model: real LSTM compute, no DataLoader, a log line every "
        "N batches",
        (str(TEST_SCRIPTS / "word_lm.py"), "--log-interval", "10"),
        ("--batch_size", "{batch_size}"), ("--batch_size", "20"), ("batch_size=20",),
        # "| epoch   1 |   200/ 2983 batches | ms/batch 52.31 | samples/s 382.4 | loss 6.52"
        re.compile(r"^\| epoch .*\| samples/s +([0-9.]+)", re.M)),
    "mingpt": Shape(
        "minGPT's chargpt: 5 s of sampling, a slow first step, ~1 s steps",
        (str(TEST_SCRIPTS / "slow_steps.py"), "--log-every", "3"),
        ("--trainer.batch_size={batch_size}", "--trainer.num_workers={workers}"),
        ("--trainer.batch_size=32", "--trainer.num_workers=0"),
        ("batch_size=32", "workers=0"),
        # "iter 10: dt 1012 ms, 31.62 samples/s"
        re.compile(r"^iter \d+: dt [0-9.]+ ms, ([0-9.]+) samples/s", re.M)),
    "nanogpt": Shape(
        "nanoGPT's train.py: --key=value flags, get_batch() without a DataLoader, evaluation "
        "pauses",
        (str(BENCH_SCRIPTS / "nanogpt_shape.py"), "--eval_interval=100", "--eval_iters=20",
         "--log_interval=10"),
        ("--batch_size={batch_size}",), ("--batch_size=12",), ("batch_size=12",),
        # "iter 40: loss 2.3012, time 123.45ms, 97.2 samples/s"
        re.compile(r"^iter \d+: loss [0-9.]+, time [0-9.]+ms, ([0-9.]+) samples/s", re.M)),
    "lightning_ddp": Shape(
        "Lightning's Trainer(devices=2, strategy='ddp'): it starts its second rank itself; "
        "the closure-shaped step; its own throughput callback",
        (str(TEST_SCRIPTS / "fw_lightning.py"), "--devices", "2", "--strategy", "ddp",
         "--log-every", "50"),
        ("--batch-size", "{batch_size}", "--workers", "{workers}"),
        ("--batch-size", "32", "--workers", "0"), ("batch_size=32", "workers=0"),
        re.compile(r"^lightning: batch \d+ samples/s ([0-9.]+)", re.M)),
}
ALIASES = {"slow_steps": "mingpt"}  # bench_claims's name for the minGPT shape
# the shapes bench_search grids as plain processes: one rank each, every knob a flag or threads
SEARCHED = ("word_lm", "mingpt", "nanogpt")


def named(name: str) -> Shape:
    return SHAPES[ALIASES.get(name, name)]


def own_rate(text: str, pattern: re.Pattern) -> float | None:
    """The mean of the script's own samples/s lines after the first; None without two."""
    rates = [float(m.group(1)) for m in pattern.finditer(text)]
    return sum(rates[1:]) / len(rates[1:]) if len(rates) > 1 else None


def timed_run(argv: list[str], cwd: Path, seconds: float, env: Mapping[str, str]) -> str:
    """Run ``argv`` for ``seconds``, then SIGINT (its whole process group; SIGKILL when it is
    still there 10 s later), and its output. The run gets SIGINT's default action whatever the
    bench inherited: a bench started in the background of a shell ignores SIGINT, and so would
    every run, which would then train on until killed (and be measured for that long)."""
    p = start(argv, cwd, env)
    try:
        out, _ = p.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGINT)
        try:
            out, _ = p.communicate(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
    return out


STOP_S = 10.0  # after SIGINT, this long before SIGKILL


def start(argv: list[str], cwd: Path, env: Mapping[str, str]) -> subprocess.Popen:
    """A plain run in its own process group, its output (stderr too) on a text pipe, with
    SIGINT's default action whatever the bench inherited (`timed_run`)."""
    return subprocess.Popen(argv, cwd=cwd, env=dict(env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1,
                            start_new_session=True, preexec_fn=_default_sigint)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class NotPlain(ValueError):
    """A config holds a knob a plain run of the script cannot set."""


@dataclass(frozen=True)
class PlainRun:
    """One config as a user runs it without autotune: the script, its knob flags, and what
    goes into its environment (empty: the script's own threads)."""

    script: tuple[str, ...]  # the script and its fixed arguments
    flags: tuple[str, ...]  # the knobs' flags (the placeholders filled in)
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def key(self) -> tuple:
        return self.flags, tuple(sorted(self.env.items()))

    def argv(self, python: str) -> list[str]:
        return [python, *self.script, *self.flags]

    def text(self) -> str:
        """What sets the knobs, as a shell line shows it: ``OMP_NUM_THREADS=1 --batch_size=16``
        (``MKL_NUM_THREADS`` and the like, always the same, left out)."""
        return " ".join([*(f"{k}={v}" for k, v in self.env.items() if k == "OMP_NUM_THREADS"),
                         *self.flags])

    def environ(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` without thread variables of its own, plus this run's."""
        return {**{k: v for k, v in base.items() if k not in THREAD_VARS}, **self.env}


def default_run(shape: Shape) -> PlainRun:
    """The script as its user runs it: its own values, its own threads."""
    return PlainRun(shape.script, shape.plain_args)


def plain_run(shape: Shape, cfg: Mapping[str, int], sp: space.Space) -> PlainRun:
    """``cfg`` of ``sp`` as a plain run: the knobs a probe would get (`Space.trial_knobs`, the
    one translation, so a thread share becomes the thread count autotune gives it) through
    the shape's placeholders, the threads through the variables autotune sets for a rank.

    Raises:
        NotPlain: a knob only autotune can set: more than one rank, or a knob that is not a
            placeholder and differs from the script's own (the space's baseline).
    """
    knobs, instances = sp.trial_knobs(cfg)
    if instances != 1:
        raise NotPlain(f"instances={instances}: a plain run of {Path(shape.script[0]).name} is "
                       f"one process; ranks are autotune's to start")
    given = rank_command.placeholders(shape.placeholders)
    env: dict[str, str] = {}
    for name, value in knobs.items():
        if name == "threads":
            env = {var: str(int(value)) for var in THREAD_VARS}
        elif name not in given and name != "instances" and value != sp.baseline.get(name):
            raise NotPlain(f"{name}={value:g}: {Path(shape.script[0]).name} takes no flag for "
                           f"it (its own: {sp.baseline.get(name, 'unknown')})")
    return PlainRun(shape.script, tuple(rank_command.substitute(shape.placeholders, knobs)), env)
