"""The kit's two reports, ``gpu_proof.json`` and ``gpu_proof.md``, from the step records.

Pure rendering: `build` gathers the records (and the final sweep) into one object, `markdown`
writes it for people: a table of the steps (status and why), each step's lines in order, and the
side-by-side table when the measure step ran.
"""

from __future__ import annotations

from gpuproof.record import STEPS


def build(*, steps: dict[str, dict], meta: dict, leftovers: list[dict]) -> dict:
    order = [name for name in STEPS if name in steps]
    overall = "failed" if leftovers or any(steps[n]["status"] == "failed" for n in order) else \
        "ok" if all(steps[n]["status"] == "ok" for n in order) else "incomplete"
    return {"kit": "gpu_proof", "meta": meta, "overall": overall,
            "steps": {n: steps[n] for n in order}, "leftovers": leftovers}


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _num(v, digits=1) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


def markdown(report: dict) -> str:
    meta = report["meta"]
    out = [f"# GPU proof kit: {report['overall']}", "",
           f"{meta.get('when', '')} on {meta.get('host', '?')}; "
           f"command: `{meta.get('command', '')}`",
           ""]
    if meta.get("allow_cpu"):
        out += ["**--allow-cpu**: the GPU steps ran without CUDA torch, to test the kit itself; "
                "their numbers say nothing about a GPU.", ""]
    out += ["| step | status | why / what it showed |", "|---|---|---|"]
    for name, s in report["steps"].items():
        out.append(f"| {name} | {s['status']} | {_cell(s['reason'])} |")
    left = report["leftovers"]
    out.append(f"| leftovers | {'FAILED' if left else 'ok'} | "
               f"{_cell(left) if left else 'no process of the kit left after the last step'} |")
    if meta.get("mps_appeared"):
        out += ["", f"WARNING: MPS processes appeared during the run and are still there "
                    f"(without the kit's marker: someone else's, or a server of ours): "
                    f"{_cell(meta['mps_appeared'])}"]
    for name, s in report["steps"].items():
        out += ["", f"## {name}: {s['status']}", "",
                f"Started {s['started']}, {s['duration_s']:.0f} s.", ""]
        out += [f"- {_cell(line)}" for line in s["lines"]]
        if name == "measure" and s["data"].get("table"):
            out += ["", *table(s["data"]["table"])]
    return "\n".join(out) + "\n"


def table(rows: list[dict]) -> list[str]:
    out = ["| config | ranks | MPS share | samples/s (median) | vs 1 rank | each round | "
           "GPU util % | GPU mem max GiB | power W | mJ/sample | MPS served all |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        share = f"{r['share']:g}% ({r['share_source']})" if r["mps"] and r["share"] else (
            "100% (MPS)" if r["mps"] else "none")
        verified = [v for v in r["mps_verified"] if v is not None]
        served = ("n/a" if not r["mps"] else
                  "yes" if verified and all(verified) else f"NO {r['mps_verified']}")
        out.append(
            f"| {_cell(r['label'])} | {r['ranks']} | {_cell(share)} | {_num(r['median'])} | "
            f"{_num(r['vs_baseline'], 2)} | {', '.join(_num(x) for x in r['rates'])} | "
            f"{_num(r['util_pct'])} | "
            f"{_num(r['mem_used_bytes_max'] / 2**30 if r['mem_used_bytes_max'] else None, 2)} | "
            f"{_num(r['power_w'])} | "
            f"{_num(r['j_per_sample'] * 1e3 if r['j_per_sample'] else None, 3)} | {served} |")
    return out
