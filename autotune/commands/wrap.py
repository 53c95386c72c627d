"""``autotune wrap``: tune, save the recipe, then launch the full run with it."""

from __future__ import annotations

import os

from autotune.monitor import console
from autotune.store import fingerprint, jsontext
from autotune.launching import fullrun
from autotune.commands import tune


def add_parser(sub):
    p = sub.add_parser("wrap", help="tune, save the recipe, then run the script with it",
                       description="Everything 'autotune tune' does, then the full run of the "
                                   "script with the winning knobs: output streamed, Ctrl-C "
                                   "forwarded, and autotune exits with the script's exit code.")
    tune.add_tune_args(p)
    return p


def run(args) -> int:
    from autotune.monitor import watch

    prep = tune.prepare(args, "wrap")
    tune.start_journal(prep)
    code = 1
    try:
        with watch(prep.run_dir, plain=args.plain or args.json,
                   title=f"autotune wrap · {os.path.basename(prep.target[0])}"), \
                tune.ending(prep.journal) as status:
            report, recipe, path = tune.tune_in(prep)
            if not args.json:
                tune.print_summary(report, path, plain=args.plain)
            console.hint(f"full run: {' '.join(prep.target)} with "
                         f"{' '.join(f'{k}={v}' for k, v in recipe.knobs.items())}")
            knobs, instances = recipe.run_knobs(fingerprint.cores(), prep.fp.gpu_count,
                                                hosts=prep.launcher.host_count)
            code = fullrun.run_full(fullrun.FullRunSpec(
                command=prep.target, knobs=knobs, instances=instances, cwd=prep.run_cwd,
                log_dir=prep.run_dir / "logs", journal_knobs=dict(recipe.knobs),
                samples_per_step=prep.settings.samples_per_step, launcher=prep.launcher),
                prep.journal)
            status["code"] = code
    except KeyboardInterrupt:
        console.hint(f"if the tuning was cut short, resume with: autotune wrap --resume "
                     f"{prep.run_dir}")
        raise
    if args.json:
        out = tune.summary(report, path)
        out["exit_code"] = code
        print(jsontext.dumps(out))
    if code:
        console.error(f"the script exited with code {code}; its output is in "
                      f"{prep.run_dir / 'logs' / 'fullrun.log'}")
    return code
