"""``autotune wrap``: tune, save the recipe, then launch the full run with it."""

from __future__ import annotations

import os

from autotune.monitor import console
from autotune.store import jsontext
from autotune.store.events import RunKind
from autotune.commands import run as run_command
from autotune.commands import tune
from autotune.tuning.space import knobs_text


def add_parser(sub):
    p = sub.add_parser("wrap", help="tune, save the recipe, then run the script with it",
                       description="Everything 'autotune tune' does, then the full run of the "
                                   "script with the winning knobs: output streamed, Ctrl-C "
                                   "forwarded, and autotune exits with the script's exit code.")
    tune.add_tune_args(p)
    p.add_argument("--keep-batch", action="store_true",
                   help="run the confirmed config that keeps the script's global batch (when "
                        "the fastest changes it) instead of the fastest; the recipe keeps both")
    return p


def run(args) -> int:
    from autotune.monitor import watch

    prep = tune.prepare(args, RunKind.WRAP)
    tune.start_journal(prep)
    code = 1
    try:
        with watch(prep.run_dir, plain=args.plain or args.json,
                   title=f"autotune wrap · {os.path.basename(prep.target[0])}") as watching, \
                tune.ending(prep.journal, quiet=watching.quiet) as status:
            report, recipe, path = tune.tune_in(prep)
            if not args.json:
                tune.print_summary(report, path, plain=args.plain)
            recipe = run_command.chosen(recipe, keep_batch=args.keep_batch)
            console.hint(f"full run: {' '.join(prep.target)} with "
                         f"{knobs_text(recipe.knobs)}")
            code = status["code"] = run_command.full_run(
                recipe, prep.target, run_command.rank_knobs(recipe, prep.fp, prep.launcher,
                                                       told=True),
                launcher=prep.launcher, cwd=prep.run_cwd, run_dir=prep.run_dir,
                journal=prep.journal, samples_per_step=prep.settings.samples_per_step,
                fp=prep.fp, keep_batch=args.keep_batch)
    except KeyboardInterrupt:
        console.hint(f"if the tuning was cut short, resume with: autotune wrap --resume "
                     f"{prep.run_dir}")
        raise
    if args.json:
        out = tune.summary(report, path)
        out["exit_code"] = code
        print(jsontext.dumps(out))
    return run_command.said(code, prep.run_dir)
