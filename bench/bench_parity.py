"""Parity: is a config as fast under autotune as started plain, by the script's own clock?

For each config (a script, its batch and workers, its ranks, on the GPU its MPS share), three
ways of starting it, each its own processes, interleaved over rounds (plain, run, probe, then
again, the order rotated each round):

- ``plain``: as a user starts it without autotune: ``python SCRIPT ARGS`` for one rank,
  ``python -m torch.distributed.run --standalone --nproc_per_node N SCRIPT ARGS`` for N (its
  environment: one thread per rank unless the user set one); on a GPU under MPS, a private MPS
  daemon and ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` in the ranks' environment.
- ``run``: ``autotune run --recipe R -- SCRIPT ARGS``, the recipe holding exactly that config
  (its knobs through the script's ``{placeholders}``).
- ``probe``: autotune's probe of the same config, as the tuner runs one (`run_trial` with the
  knobs `space.rank_knobs` gives them), the script's output read from the probe's rank 0 log.

Each figure is the script's own: the mean of its printed samples/s lines.

On the CPU the ways of a round take turns on the machine (`bench.turns.take_turns_of`): each
is started alone until the script printed two lines, then held (its whole process tree,
controller and ranks, SIGSTOP), and they run one at a time in slices of ``--slice`` seconds
or more, in the order A B C C B A, until each ran ``--turn-seconds``. A way's figure is the
mean of its lines that came in one slice with the line before them, so no line that spans a
hold or the start counts. Runs one after another caught the machine's drift instead: over
10-30 s its rate moved by as much as the costs sought (per-round ratios of 0.75-1.19 on the
short config, 2026-12-02), so twelve rounds could not tell 0.97 from 1. A run's and a probe's
lines are read from rank 0's log as they are written (a line relayed by a held controller
would be stamped when it caught up), and a probe is held to the end of its turns: its own
end would come by a clock that ran on through the other ways' slices. Configs under MPS (and
``--one-after-another``) run the ways one after another, each alone, as follows.

One after another, the first line holds start-up and is left out. A plain run and a run
through ``autotune run`` stop once the script has
printed as many lines after its first as it prints in ``--span`` seconds started plain (at
least ``--lines``; counted once per config before the rounds: `calibrate`), and every way's
figure, the probe's too, stands on that many lines after its first, so that the three measure
a like stretch of the run; a probe ends as the tuner's do, within ``--seconds``. A config's
``run_ratio`` and ``probe_ratio`` are the medians of the per-round ratios to the plain run of
the same round; the spread is their min-max. Each run's foreign load is kept beside its figure
(``load``): the CPU other programs took meanwhile and the hypervisor's steal, in cores, from
start to stop (in turns: the round's, the same for each way). Exits 1 when
any ratio is below ``--min-ratio`` (0.97) or a config gave no figure.

``--extra-ways`` adds ways to the same rounds, reported and not judged: ``probe-ddp-own``, a
probe whose ranks keep DDP's own allreduce, as the full run's do, which tells the probe's timed
communication hook apart from the rest of a probe (on a GPU: on the CPU a probe has none), and
``probe-no-watch``, a probe whose ranks watch no directory for the files they write, which
tells `probes.writes`' wrappers apart. In turns, ``plain-log`` is the plain start with each
rank's output redirected to a file by torchrun (``--redirects 1``), its rate lines read from
that file as a run's and a probe's are from theirs: it tells the way the bench reads a rank's
lines, and a rank writing to a file rather than to a pipe, apart from autotune. In turns too,
``run-controller-held`` is a full run whose controller stays held (SIGSTOP) from its first
hold to its end, its ranks alone continued in its slices: it tells the controller's work beside
the ranks apart from theirs.

Beside it, a micro-benchmark of the meter's own cost per step, in microseconds: the counting
hooks, the step clock (host; CUDA events on a GPU) and the channel's tick. On the CPU also the
hooks' cost inside the `short` config's own training loop (`bench/hook_cost.py`): in the loop
each call costs several times what it costs alone.

Writes ``bench/results/parity-<date>-<host>.json`` (``--out`` to change it)::

    {"device": "<NVML's name, or 'cpu'>", "configs": [{"config", "ranks", "mps", "plain", "run",
     "probe", "run_ratio", "probe_ratio", ...}], "meter_us": {...}, "hook_cost_us": {...}, ...}

    .venv/bin/python bench/bench_parity.py [--rounds 3] [--lines 6] [--seconds 60]
                                           [--configs NAME...]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _p in (str(ROOT), str(ROOT / "bench")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from bench.common import say  # noqa: E402
from bench import hook_cost  # noqa: E402
from bench.meter_cost import meter_cost_us  # noqa: E402
from bench.shapes import STOP_S, THREAD_VARS, start, timed_run  # noqa: E402
from bench import turns  # noqa: E402

EXAMPLES = ROOT / "examples"
WAYS = ("plain", "run", "probe")
# ways that tell a cost apart (``--extra-ways``), measured and reported like the others but not
# judged: a probe whose ranks keep DDP's own allreduce in C++, as the full run's do (on a GPU no
# timed dispatcher of ours; on the CPU a probe has none since d6319fb), and a probe whose ranks
# watch no directory for writes (none of `probes.writes`' wrappers: the one thing left in a
# CPU probe's ranks that a full run's lack), and a plain start whose ranks write their output to
# files, read back as a run's and a probe's are (in turns only: tells the bench's way of reading
# a rank's lines, and a rank writing to a file rather than a pipe, apart from autotune's cost),
# and a full run whose controller stays held while its ranks take their turns (in turns only:
# tells the controller's work beside its ranks apart from the ranks' own)
EXTRA_WAYS = ("probe-ddp-own", "probe-no-watch", "plain-log", "run-controller-held")
TURNS_ONLY = ("plain-log", "run-controller-held")
MIN_RATIO = 0.97
# the examples' own line: "epoch 1 step 40 loss 2.2893 samples/s 1319.3"
EXAMPLE_RATE = re.compile(r"^(?:\[rank 0\] )?epoch \d+ step \d+ loss [0-9.naif]+ .*?samples/s "
                          r"([0-9.]+)", re.M)
NANOGPT_RATE = re.compile(r"^iter \d+: loss [0-9.]+, time [0-9.]+ms, ([0-9.]+) samples/s", re.M)
LIGHTNING_RATE = re.compile(r"^lightning: batch \d+ samples/s ([0-9.]+)", re.M)


@dataclass(frozen=True)
class Config:
    """One config: a script with ``{placeholders}`` for its knobs, and the knobs' values."""

    name: str
    what: str
    script: tuple[str, ...]  # the script and its fixed arguments
    placeholders: tuple[str, ...]  # the knob arguments, {batch_size} and the like
    knobs: Mapping[str, int]  # batch_size, workers (what the placeholders take)
    ranks: int = 1
    device: str = "cpu"
    share: int = 100  # on a GPU: each rank's MPS share (thread_pct)
    rate: re.Pattern = EXAMPLE_RATE
    threads: int | None = None  # OMP_NUM_THREADS as the user writes it (None: not set)
    own_ranks: int = 1  # ranks the script starts itself (Lightning's launcher): one to us

    @property
    def mps(self) -> bool:
        return self.device == "gpu" and (self.ranks > 1 or self.share < 100)

    @property
    def recipe_knobs(self) -> dict[str, int]:
        """What the recipe holds: the knobs, the ranks, and the threads a plain start gives: on
        the CPU one rank's own (all cores), else torchrun's one each (the share of one core);
        on a GPU each rank's MPS share (its threads: torchrun's rule, autotune's too)."""
        if self.device == "gpu":
            return {**self.knobs, "instances": self.ranks, "thread_pct": self.share}
        from autotune.tuning import space

        cores = len(os.sched_getaffinity(0))
        threads = self.threads or (None if self.ranks == 1 else 1)  # torchrun's: 1 for several
        if self.own_ranks > 1 and not self.threads:  # Lightning's: the cores split evenly
            threads = max(1, cores // self.own_ranks)
        pct = 100 if threads is None else space.pct_for_threads(threads, cores)
        return {**self.knobs, "instances": self.ranks, "thread_pct": pct}

    def args(self) -> list[str]:
        """The script's arguments with the knobs' values in: what a user types."""
        from autotune.launching import rank_command

        return [*self.script, *rank_command.substitute(self.placeholders, self.knobs)]


def _compute(ranks: int) -> Config:
    return Config(f"short-{ranks}r", "a small MLP on in-memory tensors: steps of a few ms",
                  (str(EXAMPLES / "compute_bound" / "train.py"), "--features", "64",
                   "--hidden", "128", "--num-samples", "4096", "--epochs", "100000",
                   "--log-interval", "25"),
                  ("--batch-size", "{batch_size}", "--workers", "{workers}"),
                  {"batch_size": 16, "workers": 0}, ranks)


def _images(ranks: int) -> Config:
    return Config(f"data-{ranks}r", "a small CNN on PNG files decoded in DataLoader workers",
                  (str(EXAMPLES / "image_classifier" / "train.py"), "--num-images", "512",
                   "--epochs", "100000", "--log-interval", "2"),
                  ("--batch-size", "{batch_size}", "--workers", "{workers}"),
                  {"batch_size": 32, "workers": 2 // ranks}, ranks)


def _nanogpt() -> Config:
    return Config("nanogpt-1r", "nanoGPT's train.py shape: get_batch(), no DataLoader",
                  (str(ROOT / "bench" / "scripts" / "nanogpt_shape.py"), "--eval_interval=0",
                   "--log_interval=5"),
                  ("--batch_size={batch_size}",), {"batch_size": 12}, 1, rate=NANOGPT_RATE)


def _lightning() -> Config:
    return Config("lightning-2r", "Lightning's Trainer(devices=2, strategy='ddp'): it starts "
                  "its second rank itself, steps of a few ms",
                  (str(ROOT / "tests" / "scripts" / "fw_lightning.py"), "--devices", "2",
                   "--strategy", "ddp", "--log-every", "50"),
                  ("--batch-size", "{batch_size}", "--workers", "{workers}"),
                  {"batch_size": 32, "workers": 0}, 1, rate=LIGHTNING_RATE, own_ranks=2)


def _cuda(ranks: int, share: int) -> Config:
    return Config(f"cuda-{ranks}r" + (f"-mps{share}" if ranks > 1 else ""),
                  "the bundled CUDA example (a small CNN, images made on the CPU in workers)",
                  (str(EXAMPLES / "cuda_small" / "train.py"), "--epochs", "100000",
                   "--backend", "gloo" if ranks > 1 else "auto", "--log-interval", "20"),
                  ("--batch-size", "{batch_size}", "--workers", "{workers}"),
                  {"batch_size": 64, "workers": 4}, ranks, "gpu", share)


def configs_for(device: str, threads: int | None = None) -> list[Config]:
    """The host's configs; ``threads``: the ``OMP_NUM_THREADS`` a user writes for every one of
    them (on a busy machine one thread a rank keeps OpenMP from spinning on a core another
    program holds, which swings a two-thread rank's rate severalfold)."""
    if device == "gpu":
        # 4 ranks at 100% each: the config the kit found 1.81x one rank started plain, 1.19x
        # through `autotune run` (2026-11-27)
        return [_cuda(1, 100), _cuda(2, 50), _cuda(4, 25), _cuda(4, 100)]
    own = (_lightning(),) if importlib.util.find_spec("lightning") else ()  # the extra installed
    return [replace(c, threads=threads) for c in
            (_compute(1), _compute(2), _images(1), _images(2), _nanogpt(), *own)]


# -- the three ways --------------------------------------------------------------------------
@dataclass
class Ctx:
    work: Path
    seconds: float  # the most one run may take, start-up included
    env: dict[str, str]
    lines: int = 6  # a run stops once the script printed this many rate lines after its first
    span_s: float = 10.0  # ...or as many as it prints in this long, when that is more
    lines_for: dict[str, int] = field(default_factory=dict)  # per config (`calibrate`)
    probe_min_s: float = 10.0  # a probe measures at least this long (the tuner's: 5)
    mps_binary: str | None = None
    recipes: dict[str, Path] = field(default_factory=dict)
    turn_s: float = 0.0  # > 0: the ways of a round take turns, each running this long
    slice_s: float = 3.0  # ...in slices of at least this long


def user_env(base: Mapping[str, str]) -> dict[str, str]:
    """The environment a user starts from: theirs, without thread variables (the examples and
    torchrun set their own) and without autotune's, with this checkout first on ``PYTHONPATH``
    (`gpuproof.context.root_first`: the work dir's ``python -m autotune`` finds it)."""
    from gpuproof.context import root_first

    return root_first({k: v for k, v in base.items()
                       if k not in THREAD_VARS and not k.startswith("AUTOTUNE_")})


def _torchrun(c: Config, python: str, *flags: str) -> list[str]:
    """Pure: ``c``'s ranks started by torchrun on this host, with torchrun's ``flags``."""
    return [python, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={c.ranks}", *flags, *c.args()]


def plain_argv(c: Config, python: str) -> list[str]:
    """Pure: the command a user types for ``c``."""
    if c.ranks == 1:
        return [python, *c.args()]
    return _torchrun(c, python)


def plain_log_argv(c: Config, python: str, log_dir: Path) -> list[str]:
    """Pure: ``c`` started by torchrun (of one rank too) with each rank's stdout redirected to
    a file under ``log_dir`` (``--redirects 1``), as a cluster user keeps per-rank logs."""
    return _torchrun(c, python, "--redirects", "1", "--log-dir", str(log_dir))


def plain_env(c: Config, ctx: Ctx) -> dict[str, str]:
    """The environment of a plain start: the user's, with ``c``'s threads where it sets them."""
    env = dict(ctx.env)
    if c.threads:
        env.update({var: str(c.threads) for var in THREAD_VARS})
    return env


def run_argv(c: Config, python: str, recipe: Path, runs_dir: Path) -> list[str]:
    """Pure: ``autotune run`` of ``recipe`` on the script with its placeholders."""
    return [python, "-m", "autotune", "run", "--plain", "--recipe", str(recipe), "--runs-dir",
            str(runs_dir), "--", *c.script, *c.placeholders]


def write_recipe(c: Config, work: Path) -> Path:
    """A recipe holding exactly ``c``'s knobs, as ``autotune tune`` would save it (its figure:
    none, so the run is not held to one)."""
    from autotune.hardware import fingerprint
    from autotune.tuning import recipes

    target = (sys.executable, *c.script, *c.placeholders)
    fp = fingerprint.current(target)
    r = recipes.Recipe(name=f"parity-{c.name}", knobs=c.recipe_knobs, samples_per_s=0.0,
                       ci_half=0.0, baseline_samples_per_s=0.0, speedup=1.0, kept_baseline=True,
                       fingerprint=fp, script_path=c.script[0],
                       script_args=tuple([*c.script[1:], *c.placeholders]),
                       baseline_knobs=c.recipe_knobs, source="bench_parity",
                       reason="the config under test")
    return recipes.save(r, work / "recipes")


def one_plain(c: Config, ctx: Ctx) -> str:
    env = plain_env(c, ctx)
    daemon = None
    if c.mps:
        from gpuproof import mpsd

        daemon = mpsd.Daemon(ctx.mps_binary, env=env, work=ctx.work).start()
        env.update(daemon.client_env(c.share))
    try:
        return lines_run(plain_argv(c, sys.executable), c.rate, ctx, env, ctx.lines_for[c.name])
    finally:
        if daemon is not None:
            daemon.stop()


def one_run(c: Config, ctx: Ctx) -> str:
    argv = run_argv(c, sys.executable, ctx.recipes[c.name], ctx.work / "runs")
    return lines_run(argv, c.rate, ctx, ctx.env, ctx.lines_for[c.name])


def lines_run(argv: list[str], rate: re.Pattern, ctx: Ctx, env: Mapping[str, str],
              lines: int, *, span_s: float | None = None) -> str:
    """``argv`` until the script printed ``lines`` rate lines after its first (each run
    measures as much of its own steady stretch, whatever its start-up took), or with
    ``span_s``, until that long after its first; at most ``ctx.seconds``; then SIGINT to its
    group (SIGKILL `shapes.STOP_S` later). Its output, each rate line after the first that
    came within ``span_s`` of it (all of them without ``span_s``)."""
    p = start(argv, ctx.work, env)
    got: list[tuple[float, str]] = []
    deadline = time.monotonic() + ctx.seconds

    def read() -> None:
        for line in p.stdout:
            got.append((time.monotonic(), line))

    def first_t() -> float | None:
        return next((t for t, line in list(got) if rate.search(line)), None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        while p.poll() is None and time.monotonic() < deadline:
            if span_s is None and len(rate.findall("".join(x for _, x in got))) >= lines + 1:
                break
            first = first_t() if span_s is not None else None
            if first is not None and time.monotonic() >= first + span_s:
                break
            time.sleep(0.1)
    finally:
        _stop_group(p)
        reader.join(timeout=STOP_S)
    first = first_t()
    if span_s is None or first is None:
        return "".join(x for _, x in got)
    return "".join(x for t, x in got if t <= first + span_s)


def calibrate(c: Config, ctx: Ctx) -> int:
    """How many rate lines after its first ``c``'s script prints in ``ctx.span_s``, started
    plain (never fewer than ``ctx.lines``). Every way's figure stands on that many lines after
    its first, so the three measure a like stretch of the run: by a count alone, a run of 7 ms
    steps logged every 25 stood on a second of lines while its probe's ran on for 15 s."""
    env = dict(ctx.env)
    if c.threads:
        env.update({var: str(c.threads) for var in THREAD_VARS})
    if c.mps:
        return ctx.lines  # a daemon of its own for one count: the count alone will do
    text = lines_run(plain_argv(c, sys.executable), c.rate, ctx, env, ctx.lines,
                     span_s=ctx.span_s)
    return max(ctx.lines, len(c.rate.findall(text)) - 1)


def first_lines_rate(text: str, pattern: re.Pattern, lines: int) -> float | None:
    """Pure: the mean of the script's own rate lines 2 to ``lines`` + 1 (the first holds
    start-up); None without two."""
    rates = [float(m.group(1)) for m in pattern.finditer(text)][:lines + 1]
    return sum(rates[1:]) / len(rates[1:]) if len(rates) > 1 else None


def one_probe(c: Config, ctx: Ctx, *, ddp_own: bool = False, no_watch: bool = False) -> str:
    """The probe in its own process (`probe_main`), and rank 0's log; ``ddp_own``: its ranks
    keep DDP's own allreduce, ``no_watch``: they watch no directory for writes
    (`EXTRA_WAYS`)."""
    spec = {"config": c.name, "device": c.device, "threads": c.threads, "seconds": ctx.seconds,
            "min_s": ctx.probe_min_s, "log_dir": str(ctx.work / "probes"), "ddp_own": ddp_own,
            "no_watch": no_watch}
    argv = [sys.executable, str(Path(__file__).resolve()), "--probe-one", json.dumps(spec)]
    out = _run_to_end(argv, ctx, ctx.seconds + 60.0)
    last = out.strip().splitlines()[-1] if out.strip() else ""
    try:
        log = json.loads(last)["log_path"]
        return Path(log).read_text(errors="replace")
    except (ValueError, KeyError, OSError):
        say(f"  probe of {c.name} said: {out[-600:]}")
        return ""


def _run_to_end(argv: list[str], ctx: Ctx, limit_s: float) -> str:
    """``argv`` to its end (at most ``limit_s``); its group stopped however this returns, a
    Ctrl-C of the bench included (it runs in a session of its own)."""
    p = start(argv, ctx.work, ctx.env)
    try:
        out, _ = p.communicate(timeout=limit_s)
        return out
    except subprocess.TimeoutExpired:
        return ""
    finally:
        _stop_group(p)


def _stop_group(p: subprocess.Popen) -> None:
    """A process group still running stopped as Ctrl-C would, then killed after the grace."""
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGINT)
        try:
            p.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def probe_main(spec_text: str) -> int:
    """One probe of a config, as the tuner's prober runs it; prints {"log_path", "meter"}."""
    from autotune.hardware import fingerprint
    from autotune.measuring.trial import TrialSpec, run_trial
    from autotune.tuning import space
    from probes import protocol

    spec = json.loads(spec_text)
    c = next(x for x in configs_for(spec["device"], spec.get("threads"))
             if x.name == spec["config"])
    if spec.get("ddp_own"):  # the ranks inherit this process's environment
        os.environ[protocol.ENV_LEAVE_DDP_ALLREDUCE] = "1"
    fp = fingerprint.current([sys.executable, *c.script])
    knobs, instances = space.rank_knobs(c.recipe_knobs, cores=fp.cores, device=c.device,
                                        devices=max(1, fp.gpu_count) if c.device == "gpu" else 1)
    seconds = float(spec["seconds"])
    Path(spec["log_dir"]).mkdir(parents=True, exist_ok=True)
    result = run_trial(TrialSpec.of(
        command=(*c.script, *c.placeholders), knobs=knobs, instances=instances, cwd=os.getcwd(),
        log_dir=(Path(spec["log_dir"]) if spec.get("fixed_dir") else
                 Path(tempfile.mkdtemp(prefix=f"{c.name}-", dir=spec["log_dir"]))),
        name=f"parity-{c.name}", max_s=seconds,
        watch_dirs=() if spec.get("no_watch") else None,
        min_measure_s=(seconds if spec.get("held") else
                       min(float(spec.get("min_s", 10.0)), 0.6 * seconds))))
    print(json.dumps({"log_path": result.log_path, "meter": result.samples_per_s,
                      "outcome": result.outcome.value}), flush=True)
    return 0


def turn_start(way: str, c: Config, ctx: Ctx, rnd: int) -> turns.Start:
    """Pure but for a fresh log folder: ``way`` of ``c`` as one command of a round in turns
    (`turns.take_turns_of`). A run's and a probe's rate lines come from rank 0's log (not
    relayed by a controller held with it), and a probe is held to
    the end of its turns (its measuring floor at its limit): its own end would come by a
    clock that ran on through the other ways' slices."""
    if way == "plain":
        return turns.Start(tuple(plain_argv(c, sys.executable)), plain_env(c, ctx))
    log_dir = Path(tempfile.mkdtemp(prefix=f"{c.name}-{rnd}-{way}-", dir=ctx.work))
    if way == "plain-log":  # torchrun's own redirect: rank 0's stdout in its log folder
        return turns.Start(tuple(plain_log_argv(c, sys.executable, log_dir)), plain_env(c, ctx),
                           log_dir / "*" / "attempt_*" / "0" / "stdout.log")
    if way in ("run", "run-controller-held"):  # its own runs folder: rank 0's log is the
        # one `fullrun.log` under it
        return turns.Start(tuple(run_argv(c, sys.executable, ctx.recipes[c.name], log_dir)),
                           ctx.env, log_dir / "*" / "logs" / "fullrun.log",
                           root_held=way == "run-controller-held")
    seconds = ctx.seconds * (len(WAYS) + len(EXTRA_WAYS))
    spec = {"config": c.name, "device": c.device, "threads": c.threads, "seconds": seconds,
            "min_s": seconds, "held": True, "log_dir": str(log_dir), "fixed_dir": True,
            "ddp_own": way == "probe-ddp-own", "no_watch": way == "probe-no-watch"}
    return turns.Start((sys.executable, str(Path(__file__).resolve()), "--probe-one",
                        json.dumps(spec)), ctx.env, log_dir / f"parity-{c.name}.log")


RUNNERS = {"plain": one_plain, "run": one_run, "probe": one_probe,
           "probe-ddp-own": lambda c, ctx: one_probe(c, ctx, ddp_own=True),
           "probe-no-watch": lambda c, ctx: one_probe(c, ctx, no_watch=True)}


# -- foreign load -----------------------------------------------------------------------------
def _cpu_now() -> tuple[float, float, float, float]:
    """(monotonic s, programs' CPU s on the machine, hypervisor steal s, this process's and
    its waited-for descendants' CPU s)."""
    import psutil

    t = psutil.cpu_times()
    mine = os.times()
    return (time.monotonic(), t.user + t.nice + t.system, getattr(t, "steal", 0.0),
            mine.user + mine.system + mine.children_user + mine.children_system)


def load_between(a: tuple[float, float, float, float],
                 b: tuple[float, float, float, float]) -> dict[str, float]:
    """Pure: what other programs (``others``) and the hypervisor (``steal``) took of the
    machine between two `_cpu_now` readings, in cores. A run's own processes are this bench's
    children, waited for by the time of the second reading, so they are not counted."""
    dt = b[0] - a[0]
    if dt <= 0:
        return {"others": 0.0, "steal": 0.0}
    others = (b[1] - a[1]) - (b[3] - a[3])
    return {"others": round(max(0.0, others) / dt, 3), "steal": round((b[2] - a[2]) / dt, 3)}


# -- figures ----------------------------------------------------------------------------------
def rotations(rounds: int, ways: Sequence[str] = WAYS) -> list[tuple[str, ...]]:
    """Pure: round r starts the ways rotated by r (plain run probe, run probe plain, ...)."""
    return [tuple(ways[(i + r) % len(ways)] for i in range(len(ways))) for r in range(rounds)]


def summarise(c: Config, rates: Mapping[str, Sequence[float | None]],
              loads: Mapping[str, Sequence[Mapping[str, float]]] | None = None) -> dict:
    """Pure: the medians of each way's figures and of the per-round ratios to plain, with the
    ratios' min and max; ``loads``: each run's foreign load (`load_between`), kept by round."""
    ways = [*WAYS, *(w for w in EXTRA_WAYS if w in rates)]
    row: dict = {"config": c.name, "ranks": c.ranks, "mps": c.mps, "knobs": dict(c.knobs),
                 "rounds": {w: list(rates.get(w, ())) for w in ways},
                 "load": {w: [dict(x) for x in (loads or {}).get(w, ())] for w in ways}}
    for w in ways:
        got = [r for r in rates.get(w, ()) if r]
        row[w] = statistics.median(got) if got else None
    for w in ways[1:]:
        ratios = [a / p for a, p in zip(rates.get(w, ()), rates.get("plain", ())) if a and p]
        row[f"{w}_ratios"] = ratios
        row[f"{w}_ratio"] = statistics.median(ratios) if ratios else None
        row[f"{w}_spread"] = [min(ratios), max(ratios)] if ratios else None
    return row


def failures(rows: Sequence[dict], min_ratio: float) -> list[str]:
    """Pure: what fails the bench: a ratio below ``min_ratio``, or none measured."""
    out = []
    for row in rows:
        for w in ("run", "probe"):
            r = row.get(f"{w}_ratio")
            if r is None:
                out.append(f"{row['config']} {w}: no figure")
            elif r < min_ratio:
                out.append(f"{row['config']} {w}: {r:.3f} < {min_ratio}")
    return out


def _f(v, d=3) -> str:
    return "n/a" if v is None else f"{v:.{d}f}"


def table(rows: Sequence[dict]) -> str:
    lines = [f"{'config':<14}{'ranks':>6}{'mps':>5}{'plain':>10}{'run':>10}{'probe':>10}"
             f"{'run/plain':>22}{'probe/plain':>22}"]
    for r in rows:
        spread = {w: (f" ({_f(r[f'{w}_spread'][0], 2)}-{_f(r[f'{w}_spread'][1], 2)})"
                      if r.get(f"{w}_spread") else "") for w in ("run", "probe")}
        lines.append(f"{r['config']:<14}{r['ranks']:>6}{'yes' if r['mps'] else 'no':>5}"
                     f"{_f(r['plain'], 1):>10}{_f(r['run'], 1):>10}{_f(r['probe'], 1):>10}"
                     f"{_f(r['run_ratio']) + spread['run']:>22}"
                     f"{_f(r['probe_ratio']) + spread['probe']:>22}")
    for r in rows:
        for w in EXTRA_WAYS:
            if r.get(f"{w}_ratio") is not None:
                lo, hi = r[f"{w}_spread"]
                lines.append(f"{r['config']:<14}{w}: {_f(r[w], 1)} samples/s, "
                             f"{_f(r[f'{w}_ratio'])} ({_f(lo, 2)}-{_f(hi, 2)}) of plain")
    return "\n".join(lines)


# -- the bench --------------------------------------------------------------------------------
def device_name() -> str:
    try:
        import torch

        if not torch.cuda.is_available():
            return "cpu"
    except ImportError:
        return "cpu"
    smi = shutil.which("nvidia-smi")
    if smi:
        p = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader", "-i", "0"],
                           capture_output=True, text=True)
        if p.returncode == 0 and p.stdout.strip():
            return p.stdout.strip().splitlines()[0]
    return torch.cuda.get_device_name(0)


def measure(configs: Sequence[Config], ctx: Ctx, rounds: int,
            after_round=lambda rows: None, extra: Sequence[str] = ()) -> list[dict]:
    """Every config's ways (and the ``extra`` ones) over ``rounds`` rounds; ``after_round``
    gets the rows so far (a report written each round survives a run cut short)."""
    ways = (*WAYS, *extra)
    rates = {c.name: {w: [] for w in ways} for c in configs}
    loads = {c.name: {w: [] for w in ways} for c in configs}
    for rnd, order in enumerate(rotations(rounds, ways), start=1):
        if rnd > 1:
            after_round([summarise(c, rates[c.name], loads[c.name]) for c in configs])
        for c in configs:
            if ctx.turn_s > 0:
                in_turns(c, ctx, rnd, order, rates[c.name], loads[c.name])
                continue
            for way in order:
                before = _cpu_now()
                rate = first_lines_rate(RUNNERS[way](c, ctx), c.rate, ctx.lines_for[c.name])
                after = _cpu_now()
                load = load_between(before, after)
                rates[c.name][way].append(rate)
                loads[c.name][way].append(load)
                say(f"round {rnd} {c.name:<12} {way:<6} "
                    + (f"{rate:9.1f} samples/s" if rate else "no figure")
                    + f" ({after[0] - before[0]:.0f} s; other programs {load['others']:.2f} "
                      f"cores, steal {load['steal']:.2f})")
    return [summarise(c, rates[c.name], loads[c.name]) for c in configs]


def in_turns(c: Config, ctx: Ctx, rnd: int, order: Sequence[str],
             rates: dict[str, list], loads: dict[str, list]) -> None:
    """Round ``rnd`` of ``c`` with its ways taking turns (`turns.take_turns_of`), started in
    ``order``: each way's figure, and the round's foreign load (the same for every way)."""
    before = _cpu_now()
    got = turns.take_turns_of([turn_start(w, c, ctx, rnd) for w in order], c.rate, ctx.work,
                              measure_s=ctx.turn_s, start_s=ctx.seconds, slice_s=ctx.slice_s)
    load = load_between(before, _cpu_now())
    for way, reading in zip(order, got):
        rates[way].append(reading.rate)
        loads[way].append(load)
        say(f"round {rnd} {c.name:<12} {way:<6} "
            + (f"{reading.rate:9.1f} samples/s ({len(reading.counted)} lines in "
               f"{len(reading.slices)} slices, {len(reading.left_out)} left out)"
               if reading.rate else f"no figure: {reading.tail[-300:]}")
            + f"; other programs {load['others']:.2f} cores, steal {load['steal']:.2f}")


def _warm(configs: Sequence[Config], ctx: Ctx) -> None:
    """One short plain run of each script: datasets made, caches warm, before any round."""
    for script in dict.fromkeys(c.script[0] for c in configs):
        c = next(x for x in configs if x.script[0] == script)
        timed_run(plain_argv(replace(c, ranks=1), sys.executable), ctx.work,
                  min(ctx.seconds, 15.0), ctx.env)


def _out_path() -> Path:
    host = re.sub(r"[^A-Za-z0-9_.-]+", "-", platform.node() or "host")
    return ROOT / "bench" / "results" / f"parity-{datetime.date.today():%Y-%m-%d}-{host}.json"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3)")
    p.add_argument("--lines", type=int, default=6,
                   help="a run stops once the script printed this many of its own rate lines "
                        "after its first (6)")
    p.add_argument("--span", type=float, default=10.0,
                   help="...or as many as it prints in this many seconds after its first, "
                        "started plain, when that is more; every way's figure stands on as many "
                        "(10)")
    p.add_argument("--seconds", type=float, default=60.0,
                   help="the most one run takes, start-up included; a probe's limit (60)")
    p.add_argument("--configs", nargs="+", default=None,
                   help="names, measured in this order each round (default: the host's)")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    p.add_argument("--probe-min-s", type=float, default=10.0,
                   help="a probe measures at least this long before it may end tight (10)")
    p.add_argument("--min-ratio", type=float, default=MIN_RATIO)
    p.add_argument("--out", type=Path, default=None, help="the JSON report (default "
                   "bench/results/parity-DATE-HOST.json)")
    p.add_argument("--threads", type=int, default=None,
                   help="OMP_NUM_THREADS for every CPU config, as a user writes it (default: "
                        "not set: torch's own for one rank, torchrun's one each for several)")
    p.add_argument("--extra-ways", nargs="+", choices=EXTRA_WAYS, default=(),
                   help="more ways, measured in the same rounds and reported, not judged: "
                        "probe-ddp-own is a probe whose ranks keep DDP's own allreduce, "
                        "probe-no-watch one whose ranks watch no directory for writes, "
                        "plain-log a plain start whose ranks write to files, "
                        "run-controller-held a full run whose controller stays held while its "
                        "ranks take their turns (these two in turns only)")
    p.add_argument("--turn-seconds", type=float, default=12.0,
                   help="on the CPU the ways of a round take turns on the machine, each running "
                        "this long in its slices (12)")
    p.add_argument("--slice", type=float, default=3.0,
                   help="a slice of a turn lasts at least this long (3)")
    p.add_argument("--one-after-another", action="store_true",
                   help="the ways of a round run one after another, each alone (the way "
                        "configs under MPS always run), stopped after --lines or --span")
    p.add_argument("--no-meter", action="store_true",
                   help="skip the meter's micro-benchmark and the hooks' cost in the loop")
    p.add_argument("--probe-one", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.probe_one:
        return probe_main(args.probe_one)
    if args.rounds < 1 or args.seconds <= 0:
        p.error("--rounds >= 1 and --seconds > 0 must hold")
    name = device_name() if args.device != "cpu" else "cpu"
    device = "gpu" if name != "cpu" and args.device != "cpu" else "cpu"
    if args.device == "gpu" and device != "gpu":
        p.error("--device gpu: torch sees no CUDA device here")
    every = configs_for(device, args.threads)
    named = {c.name: c for c in every}
    unknown = [n for n in args.configs or () if n not in named]
    if unknown:
        p.error(f"--configs: {', '.join(unknown)} is not one of {', '.join(named)}")
    # in the order named: a run cut short has measured the first named in every round it began
    configs = [named[n] for n in dict.fromkeys(args.configs)] if args.configs else every
    turns_only = [w for w in args.extra_ways if w in TURNS_ONLY]
    if turns_only and (args.one_after_another or any(c.mps for c in configs)):
        p.error(f"--extra-ways {' '.join(turns_only)}: only where the ways take turns; leave "
                f"out --one-after-another and MPS configs")
    work = Path(tempfile.mkdtemp(prefix="bench_parity-"))
    ctx = Ctx(work=work, seconds=args.seconds, lines=args.lines, span_s=args.span,
              probe_min_s=args.probe_min_s,
              env={**user_env(os.environ), "PYTHONUNBUFFERED": "1",
                   "AUTOTUNE_RUNS_DIR": str(work / "runs")})
    if not args.one_after_another and not any(c.mps for c in configs):
        ctx.turn_s, ctx.slice_s = args.turn_seconds, args.slice
    if any(c.mps for c in configs):
        from gpuproof import mpsd

        ctx.mps_binary = mpsd.find(ctx.env)
        if not ctx.mps_binary:
            p.error("configs under MPS need nvidia-cuda-mps-control on PATH")
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    mode = (f"the ways of a round in turns, each running {ctx.turn_s:g} s in slices of "
            f"{ctx.slice_s:g} s or more" if ctx.turn_s else
            f"one after another; a run stops after {args.lines} of the script's lines past its "
            f"first, or {args.seconds:g} s")
    say(f"# bench_parity {datetime.datetime.now():%Y-%m-%d %H:%M} on {platform.node()} "
        f"({os.cpu_count()} cores, {name}), commit {commit}: {args.rounds} rounds, {mode}; "
        f"work dir {work}")
    meter = {} if args.no_meter else meter_cost_us()
    if meter:
        say(f"# the meter's cost per step, us: {meter}")
    in_loop = {} if args.no_meter or device != "cpu" else hook_cost.in_own_process(40)
    if in_loop:
        say(f"# the hooks' cost per step inside the short config's loop, us: {in_loop}")
    for c in configs:
        ctx.recipes[c.name] = write_recipe(c, work)
    out = args.out or _out_path()
    out.parent.mkdir(parents=True, exist_ok=True)

    def write(rows: list[dict], complete: bool) -> None:
        report = {"device": name, "host": platform.node(), "cores": os.cpu_count(),
                  "commit": commit, "when": datetime.datetime.now().isoformat(timespec="seconds"),
                  "rounds": args.rounds, "lines": args.lines, "seconds": args.seconds,
                  "span_s": args.span, "lines_for": ctx.lines_for,
                  "threads": args.threads, "extra_ways": list(args.extra_ways),
                  "turn_s": ctx.turn_s, "slice_s": ctx.slice_s if ctx.turn_s else None,
                  "min_ratio": args.min_ratio, "complete": complete, "meter_us": meter,
                  "hook_cost_us": in_loop,
                  "configs": rows}
        out.write_text(json.dumps(report, indent=2) + "\n")

    _warm(configs, ctx)
    for c in configs if not ctx.turn_s else ():
        ctx.lines_for[c.name] = calibrate(c, ctx)
        say(f"# {c.name}: every figure stands on {ctx.lines_for[c.name]} of the script's lines "
            f"after its first (~{ctx.span_s:g} s started plain)")
    rows = measure(configs, ctx, args.rounds, after_round=lambda r: write(r, False),
                   extra=tuple(dict.fromkeys(args.extra_ways)))
    say(table(rows))
    write(rows, True)
    say(f"# report: {out}")
    bad = failures(rows, args.min_ratio)
    if bad:
        say("FAILED: " + "; ".join(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    turns.end_on_sigterm()
    sys.exit(main())
