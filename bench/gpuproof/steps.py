"""The steps that drive the repo as a user would: the ``gpu`` tests under pytest, and
``autotune probe`` and ``autotune tune`` of the bundled CUDA example on the default GPU space,
and ``autotune tune --objective throughput,energy`` of it (NVML's energy counter, the Pareto
front).

After each autotune command: the MPS daemons it started (in a directory of ours, kept with
``AUTOTUNE_MPS_KEEP``) are checked to be gone, and no process of the command is left.
"""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

from gpuproof import procs
from gpuproof.context import ROOT, Context
from gpuproof.record import Step


# -- the gpu tests --------------------------------------------------------------------------------
def gpu_test_files(tests_dir: Path = ROOT / "tests") -> list[Path]:
    """Test files holding ``gpu``-marked tests (only these are collected: the others may need
    packages a GPU host lacks)."""
    return sorted(p for p in tests_dir.glob("test_*.py") if "pytest.mark.gpu" in p.read_text())


def parse_junit(text: str) -> list[dict]:
    """Pure: pytest's JUnit XML -> ``[{test, outcome (passed|failed|error|skipped), message}]``."""
    out = []
    for case in ET.fromstring(text).iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = (node.get("message") or node.text or "").strip()
                break
        out.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                    "message": message[:500]})
    return out


def run_tests(ctx: Context) -> Step:
    step = Step("tests")
    if why := ctx.gate():
        return step.skip(why)
    if not ctx.facts.get("packages", {}).get("pytest", {}).get("ok"):
        return step.skip("pytest is not importable here")
    files = gpu_test_files()
    if not files:
        return step.skip("no test file holds a gpu-marked test")
    junit = ctx.work / "junit-gpu.xml"
    junit.unlink(missing_ok=True)
    argv = [ctx.python, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
            f"--junitxml={junit}", *map(str, files)]
    step.say("ran: " + " ".join(a if a.startswith("-") else Path(a).name for a in argv[1:]))
    ran = procs.run(argv, env=ctx.env(), cwd=str(ROOT), timeout_s=900, log_path=ctx.log("pytest"))
    cases = parse_junit(junit.read_text()) if junit.exists() else []
    step.data.update(exit=ran.returncode, cases=cases, log=ran.log_path,
                     duration_s=round(ran.duration_s, 1))
    for c in cases:
        step.say(f"{c['outcome']:7} {c['test']}" + (f": {c['message']}" if c["message"] else ""))
    counts = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failed", "error",
                                                                "skipped")}
    step.data["counts"] = counts
    if ran.timed_out:
        step.fail("pytest timed out")
    elif counts["failed"] or counts["error"] or not cases:
        step.fail(f"pytest exit {ran.returncode}: {counts}; log {ran.log_path}")
    elif counts["skipped"]:
        step.partial(f"{counts['skipped']} of {len(cases)} gpu tests skipped")
    else:
        step.reason = f"{counts['passed']} gpu tests passed"
    return step


# -- autotune probe / tune ------------------------------------------------------------------------
def cli_gate(ctx: Context, *, needs_optuna: bool = False) -> str:
    if why := ctx.gate():
        return why
    env = ctx.facts.get("autotune_env", {})
    if not env.get("ok"):
        return f"autotune's command line does not start here: {env.get('why', '?')}"
    if needs_optuna and not ctx.facts.get("packages", {}).get("optuna", {}).get("ok"):
        err = ctx.facts.get("packages", {}).get("optuna", {}).get("error", "")
        return (f"optuna is not importable here ({err}); carry its wheels "
                f"(docs/benchmarks.md, 'GPU proof kit')")
    return ""


def product_mps_after(mps_dir: Path, step: Step) -> list[dict]:
    """The daemons an autotune command started under ``mps_dir``: did each get ``quit``, is it
    gone. Removes the directory afterwards."""
    seen = []
    for log in sorted(mps_dir.glob("*/log/control.log")):
        text = log.read_text(errors="replace")
        pids = re.findall(r"Control (\d+)\]", text)
        pid = int(pids[0]) if pids else None
        entry = {"control_log": str(log), "pid": pid, "quit_sent": "Cmd:quit" in text,
                 "gone": not procs.alive(pid),
                 "clients_logged": len(re.findall(r"NEW CLIENT", text))}
        seen.append(entry)
        step.say(f"autotune's MPS daemon {pid}: quit {'sent' if entry['quit_sent'] else 'NOT seen'}"
                 f" in control.log, {entry['clients_logged']} client connection(s) logged, "
                 f"{'gone' if entry['gone'] else 'STILL RUNNING'}")
        if not entry["gone"]:
            step.fail(f"autotune's MPS daemon {pid} outlived the command")
    shutil.rmtree(mps_dir, ignore_errors=True)
    return seen


def after_command(ctx: Context, step: Step, mps_dir: Path) -> None:
    step.data["product_mps"] = product_mps_after(mps_dir, step)
    left = procs.sweep(ctx.marker)
    step.data["leftovers"] = left
    if left:
        step.fail(f"{len(left)} process(es) outlived the command (stopped now): {left}")
    else:
        step.say("no process of the command left")


def last_json(text: str) -> dict | None:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def mps_warnings(output: str) -> list[str]:
    """autotune's own warnings that MPS did not serve the ranks (its check only logs them)."""
    return [ln.strip() for ln in output.splitlines()
            if "MPS clients" in ln or "no MPS server was started" in ln
            or "MPS daemon did not answer" in ln]


def run_probe(ctx: Context) -> Step:
    step = Step("probe")
    if why := cli_gate(ctx, needs_optuna=True):  # the probe reports through the tuner's baseline
        return step.skip(why)
    env, mps_dir = ctx.autotune_env()
    s = ctx.settings
    args = ["probe", "--json", "--plain", "--seconds", f"{s.probe_seconds:g}",
            "--probe-cwd", str(ctx.work / "cwd"), str(s.script), *s.script_args,
            "--epochs", "1000"]
    (ctx.work / "cwd").mkdir(parents=True, exist_ok=True)
    step.say("ran: autotune " + " ".join(args))
    ran = ctx.autotune(*args, name="autotune-probe", env=env,
                       timeout_s=3 * s.probe_seconds + 180)
    summary = last_json(ran.output)
    step.data.update(exit=ran.returncode, log=ran.log_path, summary=summary)
    if summary is None:
        step.fail(f"autotune probe exit {ran.returncode}, no JSON: {ran.tail(5)}")
    else:
        for mode, r in summary["modes"].items():
            step.say(f"mode {mode}: {r['outcome']} {r['samples_per_s']:.1f} samples/s "
                     f"+- {r['ci_half'] or 0:.1f} ({r['source']}); CUDA peak "
                     f"{(r.get('cuda_peak_bytes') or 0) / 2**20:.0f} MiB; {r['reason']}")
        step.say(f"verdict: {summary['verdict']['text']}")
        if ran.returncode != 0:
            step.fail(f"autotune probe exit {ran.returncode}: a mode did not measure")
        else:
            step.reason = summary["verdict"]["text"]
    after_command(ctx, step, mps_dir)
    return step


def tune_args(ctx: Context, *, budget: str, recipe_dir: Path, extra=()) -> list[str]:
    """``autotune tune`` of the kit's script with the kit's space, ``extra`` flags before it."""
    s = ctx.settings
    args = ["tune", "--json", "--plain", "--budget", budget, "--seed", "0", *extra,
            "--recipe-dir", str(recipe_dir), "--probe-cwd", str(ctx.work / "cwd")]
    if s.foreign_limit is not None:
        args += ["--foreign-limit", f"{s.foreign_limit:g}"]
    if s.tune_space:  # the list ends at '--', as autotune's --space asks
        args += ["--space", *s.tune_space, "--"]
    args += [str(s.script), *s.script_args, "--epochs", "1000"]
    (ctx.work / "cwd").mkdir(parents=True, exist_ok=True)
    return args


def run_tune(ctx: Context) -> Step:
    step = Step("tune")
    if why := cli_gate(ctx, needs_optuna=True):
        return step.skip(why)
    env, mps_dir = ctx.autotune_env()
    s = ctx.settings
    args = tune_args(ctx, budget=s.budget, recipe_dir=ctx.out / "recipes")
    step.say("ran: autotune " + " ".join(args))
    ran = ctx.autotune(*args, name="autotune-tune", env=env,
                       timeout_s=2 * budget_s(s.budget) + 300)
    summary = last_json(ran.output)
    step.data.update(exit=ran.returncode, log=ran.log_path, summary=summary,
                     mps_warnings=mps_warnings(ran.output))
    for w in step.data["mps_warnings"]:
        step.say(f"autotune warned: {w}")
    if summary is None or ran.returncode != 0:
        step.fail(f"autotune tune exit {ran.returncode}: {ran.tail(5)}")
    else:
        space = summary.get("space", {})
        step.say(f"space: device {space.get('device')}, domains {space.get('domains')}, "
                 f"fixed {space.get('fixed')}")
        for note in summary.get("notes") or []:
            step.say(f"autotune noted: {note}")
        unsearched = [n for n in summary.get("notes") or []
                      if n.startswith(("instances: fixed", "thread_pct: fixed"))]
        trials = trials_of(Path(summary["run_dir"]))
        step.data["trials"] = trials
        for t in trials:
            step.say(f"{t['trial']}: {t['knobs']} -> {t['outcome']} {t['samples_per_s']:.1f} "
                     f"samples/s (CUDA peak {(t['cuda_peak_bytes'] or 0) / 2**20:.0f} MiB)")
        step.data["shares"] = shares_by_instances(trials)
        step.say(f"best {summary['best']['knobs']} {summary['best']['samples_per_s']:.1f} "
                 f"samples/s vs baseline {summary['baseline']['samples_per_s']:.1f}: "
                 f"x{summary['speedup']:.2f} ({summary['reason']}); recipe {summary['recipe']}")
        step.reason = f"x{summary['speedup']:.2f} over the script's defaults: {summary['reason']}"
        if step.data["mps_warnings"]:
            step.partial("autotune warned that MPS did not serve some ranks")
        if unsearched:
            step.partial("the search left MPS alone: " + "; ".join(unsearched), say=False)
    after_command(ctx, step, mps_dir)
    return step


def run_energy(ctx: Context) -> Step:
    """``autotune tune --objective throughput,energy``: every probe's joules per sample and
    where they were read (NVML's energy counter on Volta and newer, else the power sampled;
    RAPL for the CPU packages where readable), the Pareto front and its pick. Its recipe goes
    to OUT/recipes-energy, apart from the tune step's (which the measure step runs)."""
    step = Step("energy")
    if why := cli_gate(ctx, needs_optuna=True):
        return step.skip(why)
    env, mps_dir = ctx.autotune_env()
    s = ctx.settings
    args = tune_args(ctx, budget=s.energy_budget, recipe_dir=ctx.out / "recipes-energy",
                     extra=("--objective", "throughput,energy"))
    step.say("ran: autotune " + " ".join(args))
    ran = ctx.autotune(*args, name="autotune-tune-energy", env=env,
                       timeout_s=2 * budget_s(s.energy_budget) + 300)
    summary = last_json(ran.output)
    step.data.update(exit=ran.returncode, log=ran.log_path, summary=summary,
                     mps_warnings=mps_warnings(ran.output))
    if summary is None or ran.returncode != 0:
        step.fail(f"autotune tune --objective throughput,energy exit {ran.returncode}: "
                  f"{ran.tail(5)}")
        after_command(ctx, step, mps_dir)
        return step
    run_dir = Path(summary["run_dir"])
    trials = trials_of(run_dir)
    step.data["trials"] = trials
    for t in trials:
        e = t.get("energy") or {}
        j = energy_j_per_sample(e)
        step.say(f"{t['trial']}: {t['knobs']} -> {t['outcome']} {t['samples_per_s']:.1f} "
                 f"samples/s, {'n/a' if j is None else f'{j * 1e3:.3f}'} mJ/sample "
                 f"(GPU: {e.get('gpu', 'not read')}; CPU: {e.get('cpu', 'not read')})")
    sources = energy_sources(trials)
    step.data["gpu_sources"] = sources
    pareto = (pareto_event(run_dir) or {})
    step.data["pareto"] = pareto
    front = summary.get("pareto") or []
    for p in front:
        step.say(f"front: {'*' if p.get('picked') else ' '} {p['name']} {p['knobs']}: "
                 f"{p['samples_per_s']:.1f} samples/s, {p['samples_per_j']:.4g} samples/J")
    best, base = (summary.get("score") or {}).get("best"), \
        (summary.get("score") or {}).get("baseline")
    step.say(f"picked {pareto.get('picked', '?')}; best {summary['best']['knobs']}: "
             f"{_sj(best)} vs baseline {_sj(base)}: {summary['reason']}; "
             f"recipe {summary.get('recipe')}")
    step.reason = (f"GPU joules from {', '.join(sources) or 'nowhere'}; Pareto front of "
                   f"{len(front)} config(s), picked {pareto.get('picked', '?')}: "
                   f"{summary['reason']}")
    if "NVML energy counter" not in sources:
        step.partial(f"NVML's energy counter was not read (GPU joules: "
                     f"{', '.join(sources) or 'none'})")
    if not front:
        step.partial("no Pareto front: no probe had both samples/s and samples/J")
    for w in step.data["mps_warnings"]:
        step.say(f"autotune warned: {w}")
    after_command(ctx, step, mps_dir)
    return step


def _sj(score: dict | None) -> str:
    if not score:
        return "n/a"
    spj = score.get("samples_per_j")
    return (f"{score['samples_per_s']:.1f} samples/s, "
            f"{'n/a' if spj is None else f'{spj:.4g}'} samples/J")


def energy_j_per_sample(energy: dict) -> float | None:
    """Pure: GPU + CPU joules per sample of a probe's energy reading, each where readable."""
    parts = [energy.get(k) for k in ("gpu_j_per_sample", "cpu_j_per_sample")]
    parts = [float(p) for p in parts if isinstance(p, (int, float))]
    return sum(parts) if parts else None


def energy_sources(trials: list[dict]) -> list[str]:
    """Pure: where the probes' GPU joules came from ('NVML energy counter', 'NVML power,
    sampled', ...), each once, in order; unavailable readings left out."""
    out = []
    for t in trials:
        src = (t.get("energy") or {}).get("gpu") or ""
        if src and not src.startswith("unavailable") and src not in out:
            out.append(src)
    return out


def pareto_event(run_dir: Path) -> dict | None:
    """The run's last ``pareto`` journal event (points, front, picked), without its envelope."""
    found = None
    try:
        lines = (run_dir / "events.jsonl").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("event") == "pareto":
            found = {k: v for k, v in e.items() if k not in ("t", "event")}
    return found


def budget_s(text: str) -> float:
    """Pure: '90s', '4m', '1h', '120' -> seconds (the forms autotune's --budget takes)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not m:
        raise ValueError(f"a budget looks like 90s, 4m or 1h, but got {text!r}")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def trials_of(run_dir: Path) -> list[dict]:
    """Every finished trial of a tune run, from its journal (``trial_finished`` events)."""
    out = []
    try:
        lines = (run_dir / "events.jsonl").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("event") == "trial_finished" and isinstance(e.get("result"), dict):
            r = e["result"]
            out.append({"trial": e.get("trial"), "knobs": r.get("knobs") or {},
                        "outcome": r.get("outcome"), "samples_per_s": r.get("samples_per_s") or 0.0,
                        "cuda_peak_bytes": r.get("cuda_peak_bytes"), "reason": r.get("reason"),
                        "energy": r.get("energy")})
    return out


def shares_by_instances(trials: list[dict]) -> dict[int, dict]:
    """Pure: for each instance count, the MPS share of its fastest successful trial."""
    best: dict[int, dict] = {}
    for t in trials:
        if t["outcome"] != "ok":
            continue
        n = int(t["knobs"].get("instances", 1))
        if n not in best or t["samples_per_s"] > best[n]["samples_per_s"]:
            best[n] = {"thread_pct": t["knobs"].get("thread_pct", 100), "trial": t["trial"],
                       "samples_per_s": t["samples_per_s"]}
    return best
