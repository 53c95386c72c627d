"""The env step: what this host offers the GPU path, read by the kit itself, then what autotune
says about the same host, and whether the two agree.

GPU, driver and readings through NVML; the MPS control binary (NVIDIA's ELF executable or a
script) and whether a daemon really starts as this user (started, asked, stopped with ``quit``);
torch, CUDA, NCCL and gloo; the Python packages autotune needs; ``autotune env --json``. When
MPS cannot start here, autotune's own words for that case are checked too: its ``env`` line and
what ``autotune probe --instances 2`` stops with must both say why.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import time

from gpuproof import mpsd, procs
from gpuproof.context import ROOT, Context
from gpuproof.nvmlread import Nvml
from gpuproof.record import Step

PACKAGES = ("optuna", "tomli_w", "psutil", "rich", "pynvml", "pytest", "mpi4py")
_IMPORT_CHECK = """
import importlib, json, sys
out = {}
for name in sys.argv[1:]:
    try:
        m = importlib.import_module(name)
        out[name] = {"ok": True, "version": str(getattr(m, "__version__", "") or "")}
    except Exception as exc:
        out[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
print(json.dumps(out))
"""


def run(ctx: Context) -> Step:
    step = Step("env")
    data = step.data
    data["host"] = {"name": platform.node(), "os": platform.platform(),
                    "python": platform.python_version(), "uid": os.geteuid(),
                    "cores": len(os.sched_getaffinity(0))}
    step.say(f"host {data['host']['name']}: {data['host']['cores']} cores, Python "
             f"{data['host']['python']}, uid {data['host']['uid']}")
    data["torch"] = torch_facts()
    step.say(torch_line(data["torch"]))
    data["packages"] = packages(ctx)
    missing = {k: v["error"] for k, v in data["packages"].items() if not v["ok"]}
    step.say("packages: " + ", ".join(
        f"{k} {'ok' if v['ok'] else 'MISSING'}" for k, v in data["packages"].items()))
    data["nvml"] = nvml_facts()
    step.say(nvml_line(data["nvml"]))
    for d in data["nvml"].get("devices", []):
        step.say(f"  gpu {d['index']} {d['name']}: {_gib(d['mem_used_bytes'])}/"
                 f"{_gib(d['mem_total_bytes'])} GiB used, util {d['util_pct']}%, "
                 f"power {d['power_w']} W, compute processes {d['processes']}")
    data["mps"] = mps_facts(ctx, step)
    data["autotune_env"] = autotune_env(ctx, step)
    ctx.facts.update(data)
    agree(ctx, step)
    if not data["mps"]["started"]:
        step.partial(f"MPS cannot start here: {data['mps']['why_not']}", say=False)
    if missing:
        step.partial("missing packages: " + "; ".join(f"{k} ({v})" for k, v in missing.items()))
    if step.status == "ok":
        step.reason = summary(ctx.facts)
    return step


def summary(f: dict) -> str:
    """One line: the GPUs, CUDA torch, MPS, and autotune's agreement."""
    n = f["nvml"]
    gpus = (f"{len(n['devices'])} GPU(s) {', '.join(d['name'] or '?' for d in n['devices'])}, "
            f"driver {n['driver']}" if n["ok"] else "no NVML")
    mps = "MPS starts" if f["mps"]["started"] else f"MPS does not start ({f['mps']['why_not']})"
    cuda = "CUDA torch" if f["torch"].get("cuda_available") else "no CUDA torch"
    agree = f.get("mps_agreement", {}).get("verdict", "autotune env not read")
    return f"{gpus}; {cuda}; {mps}; {agree}"


def _gib(n) -> str:
    return "?" if n is None else f"{n / 2**30:.1f}"


def torch_facts() -> dict:
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        return {"version": None, "why_not": str(exc)}
    cuda = torch.cuda.is_available()
    facts = {"version": torch.__version__, "cuda": torch.version.cuda, "cuda_available": cuda,
             "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
             if cuda else [],
             "gloo": dist.is_available() and dist.is_gloo_available(),
             "nccl": dist.is_available() and dist.is_nccl_available(), "nccl_version": None}
    if cuda and facts["nccl"]:
        try:
            facts["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception as exc:  # noqa: BLE001 - a version we cannot read is not a failure
            facts["nccl_version"] = f"unknown ({exc})"
    return facts


def torch_line(t: dict) -> str:
    if not t.get("version"):
        return f"torch not importable: {t.get('why_not')}"
    return (f"torch {t['version']} (CUDA {t['cuda'] or 'none'}; "
            f"{'sees ' + ', '.join(t['devices']) if t['cuda_available'] else 'no CUDA device'}); "
            f"gloo {'yes' if t['gloo'] else 'no'}, nccl "
            f"{('yes ' + (t['nccl_version'] or '')).strip() if t['nccl'] else 'no'}")


def packages(ctx: Context) -> dict:
    """Each package autotune (or its tests) needs, imported in a child: ok + version, or why not."""
    ran = procs.run([ctx.python, "-c", _IMPORT_CHECK, *PACKAGES], env=ctx.env(), cwd="/",
                    timeout_s=120, log_path=ctx.log("imports"))
    try:
        return json.loads(ran.output.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {name: {"ok": False, "error": f"import check failed: {ran.tail(3)}"}
                for name in PACKAGES}


def nvml_facts() -> dict:
    nvml = Nvml()
    if not nvml.ok:
        return {"ok": False, "why_not": nvml.why}
    return {"ok": True, **nvml.module_facts(),
            "driver": _str(nvml.get("nvmlSystemGetDriverVersion")),
            "cuda_driver": nvml.get("nvmlSystemGetCudaDriverVersion"),
            "devices": nvml.devices()}


def _str(v):
    return v.decode() if isinstance(v, bytes) else v


def nvml_line(n: dict) -> str:
    if not n["ok"]:
        return f"NVML: none ({n['why_not']})"
    fake = " - a TEST FAKE (pynvml says FAKE=True)" if n.get("pynvml_fake") else ""
    return (f"NVML: driver {n['driver']}, {len(n['devices'])} GPU(s), pynvml from "
            f"{n['pynvml_file']}{fake}")


def mps_facts(ctx: Context, step: Step) -> dict:
    """Is the control binary here, what is it, and does a daemon start as this user?"""
    env = ctx.env()
    binary = mpsd.find(env)
    kind = mpsd.binary_kind(binary)
    facts = {"binary": binary, "kind": kind, "uid": os.geteuid(), "started": False,
             "why_not": "", "foreign": mpsd.foreign_daemons(ctx.marker)}
    if facts["foreign"]:
        step.say(f"WARNING: MPS processes not started by the kit are running: {facts['foreign']}")
    if binary is None:
        facts["why_not"] = f"{mpsd.BINARY} is not on PATH"
        step.say(f"MPS: cannot start: {facts['why_not']}")
        return facts
    if kind != "elf":
        step.say(f"MPS: {binary} is a {kind}, not NVIDIA's ELF executable (a wrapper or a "
                 f"test fake): what it shows is not a real daemon's behaviour")
    daemon = mpsd.Daemon(binary, env=env, work=ctx.work,
                         start_timeout_s=ctx.settings.mps_start_timeout_s)
    t0 = time.monotonic()
    try:
        daemon.start()
        facts.update(started=True, start_s=round(time.monotonic() - t0, 2), pid=daemon.pid,
                     servers_at_start=daemon.servers())
        step.say(f"MPS: a daemon started as uid {os.geteuid()} in {facts['start_s']} s "
                 f"(pid {daemon.pid}) and answered get_server_list")
    except mpsd.MpsStartError as exc:
        facts["why_not"] = f"the daemon did not start as uid {os.geteuid()}: {exc}"
        step.say(f"MPS: cannot start: {facts['why_not']}")
    finally:
        facts["stop"] = daemon.stop()
    if facts["stop"]["pid"] is not None:
        gone = facts["stop"]["gone"]
        step.say(f"MPS: stopped by {facts['stop']['how']}; daemon {facts['stop']['pid']} "
                 f"{'gone' if gone else 'STILL RUNNING'}")
        if not gone:
            step.fail(f"the MPS daemon {facts['stop']['pid']} outlived its quit/TERM/KILL")
    return facts


def autotune_env(ctx: Context, step: Step) -> dict:
    ran = ctx.autotune("env", "--json", name="autotune-env", timeout_s=180)
    if ran.returncode != 0:
        why = crash_line(ran.output)
        step.fail(f"'autotune env --json' exited {ran.returncode}: {why}")
        return {"ok": False, "why": why, "error": ran.tail(20)}
    try:
        info = json.loads(ran.output[ran.output.index("{"):])
    except ValueError as exc:
        step.fail(f"'autotune env --json' printed no JSON ({exc})")
        return {"ok": False, "error": ran.tail(20)}
    step.say(f"autotune env: gpus {'yes' if info['gpus']['available'] else 'no'} "
             f"({info['gpus']['why_not'] or len(info['gpus']['devices'])}), mps "
             f"{'yes' if info['mps']['available'] else 'no (' + info['mps']['why_not'] + ')'}")
    return {"ok": True, "gpus": info["gpus"], "mps": info["mps"], "torch": info.get("torch")}


def crash_line(output: str) -> str:
    """Pure: a traceback's last line, and the last frame of ours it passed through."""
    lines = [ln.strip() for ln in output.strip().splitlines() if ln.strip()]
    if not lines:
        return "(no output)"
    ours = [ln for ln in lines if ln.startswith('File "') and str(ROOT) in ln]
    where = ours[-1].replace(f"{ROOT}/", "") if ours else ""
    return lines[-1] + (f" (raised in {where})" if where else "")


def agree(ctx: Context, step: Step) -> None:
    """autotune's view of MPS against the kit's, and its words when MPS cannot start."""
    mine, theirs = ctx.facts["mps"], ctx.facts["autotune_env"]
    if not theirs.get("ok"):
        return
    said = theirs["mps"]
    check = {"kit_started": mine["started"], "autotune_available": said["available"]}
    if mine["started"] and not said["available"]:
        check["verdict"] = (f"autotune env says MPS is not available ({said['why_not']}) but "
                            f"the kit started a daemon")
    elif not mine["started"] and said["available"]:
        check["verdict"] = (f"autotune env says MPS is available, but a daemon did not start "
                            f"here ({mine['why_not']})")
    else:
        check["verdict"] = "autotune env agrees with the kit"
    check["agree"] = check["verdict"] == "autotune env agrees with the kit"
    step.say(("" if check["agree"] else "MISMATCH: ") + check["verdict"])
    if not check["agree"]:
        step.partial(check["verdict"], say=False)
    if not mine["started"] and ctx.facts["nvml"]["ok"] and ctx.facts["nvml"]["devices"]:
        check["probe"] = probe_words(ctx, step, why=mine["why_not"])
    ctx.facts["mps_agreement"] = check
    step.data["mps_agreement"] = check


def probe_words(ctx: Context, step: Step, *, why: str) -> dict:
    """What ``autotune probe --instances 2`` stops with when MPS cannot start, and whether it
    names the cause the kit found (the binary missing, or the daemon not starting)."""
    env, mps_dir = ctx.autotune_env()
    ran = ctx.autotune("probe", "--plain", "--modes", "full", "--seconds", "30", "--instances",
                       "2", str(ctx.settings.script), *ctx.settings.script_args,
                       name="autotune-probe-no-mps", timeout_s=240, env=env)
    shutil.rmtree(mps_dir, ignore_errors=True)
    errors = [ln for ln in ran.output.splitlines() if ln.startswith("ERROR:")]
    said = errors[0] if errors else ""
    expect = r"not found" if "not on PATH" in why else r"did not start|exited"
    ok = ran.returncode != 0 and bool(re.search(expect, said))
    step.say(f"autotune probe --instances 2 without MPS: exit {ran.returncode}, said: "
             f"{said or '(no ERROR line)'} -> "
             f"{'names the cause' if ok else 'DOES NOT name the cause'}")
    if not ok:
        step.partial("autotune's message when MPS cannot start does not say why")
    return {"exit": ran.returncode, "said": said, "expected": expect, "names_cause": ok,
            "log": ran.log_path}
