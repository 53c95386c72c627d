"""The GPU path proven on a GPU host, in one command: facts, the gpu tests, autotune's probe and
tune of the bundled CUDA example (for throughput, then for throughput and energy), and a
side-by-side of 1 rank against 2-4 ranks under MPS.

    python bench/gpu_proof.py --out DIR [--budget 4m] [--energy-budget 3m]
                              [--steps env,tests,probe,tune,energy,measure]

Steps (each recorded in DIR/steps/<step>.json as it ends, so a later call with other --steps
adds to the same report; the env step runs every time, the others read its facts):

1. env: GPU, driver and readings through NVML; the MPS control binary and whether a daemon
   starts as this user (started, asked, quit, gone); torch, CUDA, NCCL, gloo; the packages
   autotune needs; ``autotune env``, and whether it agrees (with its words checked when MPS
   cannot start).
2. tests: ``pytest -m gpu`` on the files holding gpu tests; each test's outcome.
3. probe: ``autotune probe`` of examples/cuda_small/train.py (full / synthetic / io).
4. tune: ``autotune tune --budget B`` on the default GPU space; trials and shares per rank count.
5. energy: ``autotune tune --objective throughput,energy --budget E``: each probe's joules per
   sample and where they were read (NVML's energy counter, or the power sampled; RAPL), the
   Pareto front and its pick.
6. measure: 1 rank with the whole GPU vs 2, 3, 4 ranks under MPS (the tuner's shares, else fixed)
   and time-sliced, and the tuned recipe through ``autotune run``; separate processes,
   interleaved rounds, the script's own samples/s, NVML sampled, MPS clients verified.

Without CUDA torch the GPU steps are skipped with the reason (``--allow-cpu`` runs them anyway,
to test the kit itself). Reports: DIR/gpu_proof.json and DIR/gpu_proof.md. Exit 0 when nothing
failed and no process was left, else 1. See docs/benchmarks.md, 'GPU proof kit'.
"""

from __future__ import annotations

import argparse
import platform
import shlex
import signal
import sys
import time
import traceback
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpuproof import facts, measure, mpsd, procs, record, report, steps  # noqa: E402
from gpuproof.context import EXAMPLE, Context, Settings  # noqa: E402

RUNNERS = {"tests": steps.run_tests, "probe": steps.run_probe, "tune": steps.run_tune,
           "energy": steps.run_energy, "measure": measure.run}


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"a comma-separated list of integers, but got {text!r}")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"integers >= 1 must be given, but got {text!r}")
    return values


def _time_sliced(text: str) -> tuple[int, ...]:
    """``none`` runs no rank count time-sliced; else a list as for --instances."""
    return () if text.strip().lower() == "none" else _ints(text)


def _steps(text: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    bad = [n for n in names if n not in record.STEPS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"steps are {','.join(record.STEPS)}, but got {text!r}")
    return names


def _budget(text: str) -> str:
    try:
        steps.budget_s(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc))
    return text


def parse_args(argv=None) -> tuple[argparse.Namespace, Settings]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                epilog="Anything after '--' goes to the script.")
    p.add_argument("--out", required=True, type=Path, help="where the reports go")
    p.add_argument("--work", type=Path,
                   help="logs and autotune runs (default OUT/work); recipes go to OUT/recipes")
    p.add_argument("--steps", type=_steps, default=record.STEPS,
                   help=f"comma-separated subset of {','.join(record.STEPS)} (default all)")
    p.add_argument("--budget", type=_budget, default="4m", help="autotune tune --budget (4m)")
    p.add_argument("--energy-budget", type=_budget, default="3m",
                   help="the energy step's autotune tune --budget (3m)")
    p.add_argument("--foreign-limit", type=float, default=None, metavar="CORES",
                   help="autotune tune --foreign-limit for the tune and energy steps (default "
                        "autotune's own: probes under other programs' load are re-run)")
    p.add_argument("--tune-space", nargs="+", default=(), metavar="NAME=RANGE",
                   help="autotune tune --space tokens, e.g. instances=1:4 thread_pct=25:100 "
                        "(default: autotune's own space for this host and script)")
    p.add_argument("--probe-seconds", type=float, default=20.0, help="per probe mode (20)")
    p.add_argument("--seconds", type=float, default=30.0, help="each measured run (30)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds (2)")
    p.add_argument("--instances", type=_ints, default=(2, 3, 4), help="ranks per GPU (2,3,4)")
    p.add_argument("--time-sliced", type=_time_sliced, default=None,
                   help="rank counts also run without MPS, or 'none' (default: the largest "
                        "with MPS, all of them without)")
    p.add_argument("--gpu", type=int, default=0, help="the GPU index measured (0)")
    p.add_argument("--script", type=Path, default=EXAMPLE,
                   help="the training script (it must take --seconds, --backend and print "
                        "'steady samples/s X'; default the bundled CUDA example)")
    p.add_argument("--allow-cpu", action="store_true",
                   help="run the GPU steps without CUDA torch (to test the kit itself)")
    p.add_argument("--mps-start-timeout", type=float, default=15.0,
                   help="seconds a daemon may take to come up (15)")
    argv = list(sys.argv[1:] if argv is None else argv)
    script_args: list[str] = []
    if "--" in argv:
        script_args = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    args = p.parse_args(argv)
    if args.rounds < 1 or args.seconds <= 0 or args.probe_seconds <= 0:
        p.error("--rounds >= 1, --seconds > 0 and --probe-seconds > 0 must hold")
    settings = Settings(budget=args.budget, energy_budget=args.energy_budget,
                        foreign_limit=args.foreign_limit,
                        tune_space=tuple(args.tune_space),
                        probe_seconds=args.probe_seconds,
                        seconds=args.seconds, rounds=args.rounds, instances=args.instances,
                        time_sliced=args.time_sliced, gpu=args.gpu,
                        script=args.script.resolve(), script_args=tuple(script_args),
                        allow_cpu=args.allow_cpu, mps_start_timeout_s=args.mps_start_timeout)
    return args, settings


def _exit_on_signal(signum, frame):
    raise SystemExit(128 + signum)


def main(argv=None) -> int:
    args, settings = parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGHUP):  # unwind, so every finally and atexit runs
        signal.signal(sig, _exit_on_signal)
    out = args.out.resolve()
    ctx = Context(out=out, work=(args.work or out / "work").resolve(), settings=settings,
                  marker=uuid.uuid4().hex)
    ctx.work.mkdir(parents=True, exist_ok=True)
    meta = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "host": platform.node(),
            "command": shlex.join([sys.executable, *sys.argv]) if argv is None else
            shlex.join(["gpu_proof.py", *argv]), "allow_cpu": settings.allow_cpu,
            "settings": {k: str(v) if isinstance(v, Path) else v
                         for k, v in settings.__dict__.items()}}
    print(f"# gpu_proof {meta['when']} on {meta['host']}: steps {','.join(args.steps)}; "
          f"reports in {out}", flush=True)
    leftovers: list[dict] = []
    mps_before = {p["pid"] for p in mpsd.mps_processes()}
    try:
        for name in ("env", *[s for s in args.steps if s != "env"]):
            t0 = time.monotonic()
            try:
                step = facts.run(ctx) if name == "env" else RUNNERS[name](ctx)
            except Exception as exc:  # noqa: BLE001 - one step's crash must not lose the rest
                step = record.Step(name)
                step.data["traceback"] = traceback.format_exc()
                step.fail(f"the kit crashed in this step: {type(exc).__name__}: {exc}")
            step.duration_s = time.monotonic() - t0
            record.save(out, step)
    finally:
        mpsd.stop_all()
        leftovers = procs.sweep(ctx.marker)
        # An MPS server need not inherit the marker: MPS processes that were not here at the
        # start are told (not stopped: on a shared machine they may be someone else's).
        meta["mps_appeared"] = [p for p in mpsd.mps_processes() if p["pid"] not in mps_before]
        if meta["mps_appeared"]:
            print(f"WARNING: MPS processes appeared during the run and are still there: "
                  f"{meta['mps_appeared']}", flush=True)
        if leftovers:
            print(f"FAILED: processes of the kit were left and are stopped now: {leftovers}",
                  flush=True)
        final = report.build(steps=record.load_all(out), meta=meta, leftovers=leftovers)
        record.write_atomic(out / "gpu_proof.json", record.dumps(final))
        record.write_atomic(out / "gpu_proof.md", report.markdown(final))
    print(f"# overall: {final['overall']}; {out / 'gpu_proof.md'}", flush=True)
    return 0 if final["overall"] != "failed" else 1


if __name__ == "__main__":
    sys.exit(main())
