"""``autotune recipes list|show|diff``: the saved recipes."""

from __future__ import annotations

import argparse
from pathlib import Path

from autotune.measuring import breakdown
from autotune.monitor.text import cost_text
from autotune.monitor import console
from autotune.hardware import fingerprint
from autotune.store import jsontext
from autotune.tuning import recipes
from autotune.tuning.decision import Choice, claim_text
from autotune.tuning.space import knobs_text
from autotune import RecipeError, UsageError


def add_parser(sub):
    p = sub.add_parser("recipes", help="list, show or compare saved recipes",
                       description="Recipes are TOML files written by 'autotune tune' and "
                                   "'autotune wrap' (default directory ./recipes).")
    _options(p)
    p.set_defaults(recipe_dir=recipes.DEFAULT_DIR, json=False, plain=False)
    actions = p.add_subparsers(dest="action", metavar="ACTION", parser_class=type(p))
    _options(actions.add_parser("list", help="every recipe in the directory"))
    show = actions.add_parser("show", help="one recipe in full")
    show.add_argument("recipe", metavar="NAME|PATH")
    diff = actions.add_parser("diff", help="what differs between two recipes")
    diff.add_argument("a", metavar="NAME|PATH")
    diff.add_argument("b", metavar="NAME|PATH")
    for sp in (show, diff):
        _options(sp)
    return p


def _options(p) -> None:
    """The same options before or after the action (``recipes --json list``, ``list --json``);
    SUPPRESS keeps a later parser from resetting what an earlier one set."""
    p.add_argument("--recipe-dir", metavar="DIR", default=argparse.SUPPRESS,
                   help="where recipes are (default ./recipes)")
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                   help="print JSON instead of a table")
    p.add_argument("--plain", action="store_true", default=argparse.SUPPRESS, help="no colours")


def resolve(name: str, recipe_dir: Path) -> Path:
    """A path as given, else ``<recipe_dir>/<name>.toml``."""
    path = Path(name).expanduser()
    if path.is_file() or path.suffix == ".toml" or "/" in name:
        return path
    return Path(recipe_dir) / f"{name}.toml"


def flatten(recipe: recipes.Recipe) -> dict[str, object]:
    """``section.field`` -> value, for diffs and JSON."""
    doc = recipe.to_toml()
    out: dict[str, object] = {}
    for key, value in doc.items():
        if isinstance(value, dict):
            for k, v in value.items():
                out[f"{key}.{k}"] = v
        elif key != "created":
            out[key] = value
    return out


def run(args) -> int:
    action = args.action or "list"
    out = console.make_console(plain=args.plain)
    if action == "list":
        return _list(args, out)
    if action == "show":
        recipe = recipes.load(resolve(args.recipe, args.recipe_dir))
        if args.json:
            print(jsontext.dumps(recipe.to_toml()))
            return 0
        _show(recipe, out)
        return 0
    if action == "diff":
        a = recipes.load(resolve(args.a, args.recipe_dir))
        b = recipes.load(resolve(args.b, args.recipe_dir))
        fa, fb = flatten(a), flatten(b)
        rows = [(k, fa.get(k), fb.get(k)) for k in sorted(set(fa) | set(fb))
                if fa.get(k) != fb.get(k)]
        if args.json:
            print(jsontext.dumps([{"field": k, "a": x, "b": y} for k, x, y in rows]))
            return 0
        if not rows:
            out.print(f"{a.path} and {b.path} hold the same recipe")
            return 0
        table = console.Table(title=f"{a.path}  vs  {b.path}")
        for col in ("field", "a", "b"):
            table.add_column(col)
        for k, x, y in rows:
            table.add_row(k, _cell(x), _cell(y))
        out.print(table)
        return 0
    raise UsageError(f"recipes: unknown action {action!r}; choose list, show or diff")


def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, list):
        return " ".join(map(str, v)) or "(none)"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _list(args, out) -> int:
    found = recipes.listing(Path(args.recipe_dir))
    if args.json:
        print(jsontext.dumps([{"path": str(p), "error": str(r)} if isinstance(r, RecipeError)
                              else {"path": str(p), **r.to_toml()} for p, r in found]))
        return 0
    if not found:
        out.print(f"no recipes in {args.recipe_dir} (autotune tune writes them)")
        return 0
    table = console.Table(title=f"recipes in {args.recipe_dir}")
    for col in ("name", "knobs", "samples/s", "speedup", "hardware", "created"):
        table.add_column(col, justify="right" if col in ("samples/s", "speedup") else "left")
    for path, r in found:
        if isinstance(r, RecipeError):
            table.add_row(path.stem, "INVALID (see the warning)", "-", "-", "-", "-")
            continue
        table.add_row(r.name, knobs_text(r.knobs), f"{r.samples_per_s:.1f}",
                      f"{r.speedup:.2f}x" + (" (kept defaults)" if r.kept_baseline else ""),
                      fingerprint.summary(r.fingerprint), r.created)
    out.print(table)
    for path, r in found:
        if isinstance(r, RecipeError):
            console.warning(str(r))
    return 0


def _show(r: recipes.Recipe, out) -> None:
    knobs, instances = r.run_knobs(r.fingerprint.cores)
    lines = [
        f"recipe:    {r.path}",
        f"script:    {r.script_path} {' '.join(r.script_args)}".rstrip(),
        f"knobs:     {knobs_text(r.knobs)}",
        f"global batch: {r.global_batch} (a run divides it over its own world)"
        if r.global_batch else "",
        f"per rank:  {knobs_text(knobs)} ({instances} rank(s) per host)",
        f"measured:  {r.samples_per_s:.1f} ± {r.ci_half:.1f} samples/s ({r.source or '?'})"
        + (f"; a sample costs {cost_text(r.core_s_per_sample, r.gpu_s_per_sample)}"
           if r.core_s_per_sample or r.gpu_s_per_sample else ""),
        f"baseline:  {r.baseline_samples_per_s:.1f} ± {r.baseline_ci_half:.1f} samples/s with "
        f"{knobs_text(r.baseline_knobs)}",
        ("speedup:   " if r.objective == "throughput" else "gain:      ")
        + ("1x (kept the script's defaults)" if r.kept_baseline else _claim(r)),
        f"why:       {r.reason}" if r.reason else "",
        f"batch:     {r.batch_note}" if r.batch_note else "",
        _keep_line(r.keep_batch) if r.keep_batch else "",
        f"payback:   {r.payback_note}" if r.payback_note else "",
        f"verdict:   {r.verdict.get('text')}" if r.verdict else "",
        f"time goes: {breakdown.Breakdown(r.breakdown, 0).describe()}" if r.breakdown else "",
        f"hardware:  {fingerprint.summary(r.fingerprint)}",
        f"tuned on:  {r.tuned_on.text()}",
        f"script sha256: {r.fingerprint.script_sha256[:16]}  trials: {r.trials}  "
        f"created: {r.created}  autotune {r.autotune_version}",
    ]
    at = next(i for i, x in enumerate(lines) if x.startswith(("speedup:", "gain:"))) + 1
    lines[at:at] = objective_lines(r)
    for line in lines:
        if line:
            out.print(line)


def objective_lines(r: recipes.Recipe) -> list[str]:
    """What the recipe was tuned for and the winner's score parts (nothing for throughput)."""
    parts = dict(r.objective_parts or {})
    if r.objective == "throughput" and not parts:
        return []
    said = []
    if parts.get("efficiency") is not None:
        said.append(f"efficiency {parts['efficiency']:.3f} of the script's batch"
                    + (f" (B_noise {parts['noise_scale']:.4g})"
                       if parts.get("noise_scale") is not None else ""))
    if parts.get("j_per_sample") is not None:
        said.append(f"{parts['j_per_sample']:.3g} J/sample"
                    + (f" (baseline {parts['baseline_j_per_sample']:.3g})"
                       if parts.get("baseline_j_per_sample") is not None else ""))
    if parts.get("score") is not None:
        said.append(f"score {parts['score']:.4g}")
    out = [f"objective: {r.objective}" + (f": {', '.join(said)}" if said else "")]
    if parts.get("note"):
        out.append(f"           {parts['note']}")
    if parts.get("front"):
        out.append("Pareto front (* the pick):")
        out.extend(f"  {line}" for line in parts["front"])
    return out


def _claim(r: recipes.Recipe) -> str:
    """The speed-up and its interval, never rounded up (`decision.claim_text`)."""
    if r.speedup_low is None or r.speedup_high is None:
        return f"{r.speedup:.3f}x"
    return claim_text(r.speedup, r.speedup_low, r.speedup_high)


def _keep_line(k: Choice) -> str:
    """The [keep_batch] config, as ``run --keep-batch`` would run it."""
    what = "the script's defaults" if k.kept_baseline else \
        f"{knobs_text(k.knobs)}: {k.samples_per_s:.1f} ± {k.ci_half:.1f} samples/s, " \
        f"{claim_text(k.speedup, k.speedup_low, k.speedup_high)}"
    return f"keeps batch (run --keep-batch): {what}"
