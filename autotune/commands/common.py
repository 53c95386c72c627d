"""Arguments and checks shared by the commands that run a user's script."""

from __future__ import annotations

import argparse
import math
import os
import shutil
from pathlib import Path

from autotune import UsageError
from autotune.launching import script_flags
from autotune.measuring.foreign_load import FOREIGN_CORES_LIMIT
from autotune.launching.rank_command import is_python_script, placeholders
from autotune.monitor import console


def add_script_args(p: argparse.ArgumentParser) -> None:
    """``SCRIPT [ARGS...]`` (or ``-- COMMAND...``) at the end of the command line; the command's
    own long options, added before, are kept to tell the user when one went to the script."""
    own = sorted(o for a in p._actions for o in a.option_strings
                 if o.startswith("--") and o != "--help")
    p.add_argument("target", nargs=argparse.REMAINDER, metavar="SCRIPT [ARGS...]",
                   help="the training script and its own arguments, as you would give them "
                        "to python (or '-- COMMAND ...' for anything else)")
    p.set_defaults(own_options=tuple(own))


def misplaced_options(args: argparse.Namespace, target: tuple[str, ...]) -> list[str]:
    """HINT lines for tokens after the script that are options of this autotune command: they
    went to the script (everything after it does), which may not be what the user meant."""
    own = set(getattr(args, "own_options", ()))
    found = [t for t in target[1:] if t.split("=", 1)[0] in own]
    if not found:
        return []
    names = ", ".join(dict.fromkeys(t.split("=", 1)[0] for t in found))
    return [f"{names} after the script went to the script, not to autotune (everything after "
            f"the script is the script's); if meant for autotune, put it before the script: "
            f"autotune {args.command} {found[0]} ... {target[0]} ..."]


def check_placeholders(target: tuple[str, ...]) -> None:
    """Every ``{placeholder}`` in the script's arguments must get a value in every probe: a
    usage error, before anything runs, when the same arguments also set that knob explicitly
    (the explicit value wins, so the placeholder would be left without one)."""
    args = target[1:]
    explicit = script_flags.explicit_knobs(args)
    for name in sorted(placeholders(args)):
        e = explicit.get(name)
        if e is not None:
            raise UsageError(
                f"{{{name}}} is a placeholder in the script's arguments, but '{e.typed}' sets "
                f"{name} explicitly too, so the placeholder would get no value; keep one of "
                f"them (an autotune option such as --baseline goes before the script)")



def add_probe_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--probe-cwd", metavar="DIR",
                   help="run probes in DIR instead of the current directory, to keep files "
                        "the script writes (checkpoints, logs) out of your tree")
    p.add_argument("--runs-dir", metavar="DIR",
                   help="where run directories go (default: $AUTOTUNE_RUNS_DIR or "
                        "~/.autotune/runs)")
    p.add_argument("--samples-per-step", type=int, metavar="N",
                   help="samples in one optimizer step, for scripts without a DataLoader")
    p.add_argument("--metric", type=metric_pattern, metavar="REGEX",
                   help="read throughput from the script's own output (rank 0): a regex with "
                        "one named group, samples_per_s (the job's), rank_samples_per_s, "
                        "steps_per_s or ms_per_step (per rank), e.g. "
                        "'samples/s (?P<samples_per_s>[0-9.]+)'")
    p.add_argument("--foreign-limit", type=positive_float, default=None, metavar="CORES",
                   help=f"CPU load of other programs (in cores) above which a probe's figure "
                        f"is spoiled: tune re-runs it, probe flags it (default "
                        f"{FOREIGN_CORES_LIMIT:g})")
    p.add_argument("--plain", action="store_true", help="plain log lines, no live display")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end")


def metric_pattern(text: str) -> str:
    """``--metric``: checked here, so a bad pattern is a usage error before anything runs."""
    from autotune.measuring.metric import parse_metric

    try:
        parse_metric(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"--metric {text!r} ")) from None
    return text


def watch_dirs(target: tuple[str, ...]) -> tuple[str, ...]:
    """The user's tree, where a probe's writes are reported: this directory and the script's."""
    dirs = [os.getcwd()]
    if target and os.path.isfile(target[0]):
        dirs.append(os.path.dirname(os.path.abspath(target[0])))
    return tuple(dict.fromkeys(dirs))


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (``nan`` and ``inf`` would be probes without a limit)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """argparse type: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return value


def resolve_target(args: argparse.Namespace) -> tuple[str, ...]:
    """The user's command as a tuple; a usage error when the script is missing."""
    target = list(args.target or [])
    if target and target[0] == "--":
        target = target[1:]
    if not target:
        raise UsageError("no training script given: autotune "
                         f"{args.command} [OPTIONS] SCRIPT [ARGS...]")
    first = target[0]
    if first.endswith(".py") or os.sep in first or os.path.exists(first):
        if os.path.isdir(first):
            raise UsageError(f"{first!r} is a directory, not a script; give the training "
                             f"script inside it, e.g. {os.path.join(first, 'train.py')!r}")
        if not os.path.isfile(first):
            raise UsageError(f"script {first!r} not found (looked in {os.getcwd()}); "
                             f"check the path")
        if not is_python_script(first) and not os.access(first, os.X_OK):
            raise UsageError(f"{first!r} is neither a Python script nor executable; "
                             f"chmod +x it or run it through its interpreter")
    elif shutil.which(first) is None:
        raise UsageError(f"command {first!r} not found on PATH")
    for line in misplaced_options(args, tuple(target)):
        console.hint(line)
    check_placeholders(tuple(target))
    return tuple(target)


def probe_cwd(args: argparse.Namespace) -> str:
    if not getattr(args, "probe_cwd", None):
        return os.getcwd()
    path = Path(args.probe_cwd).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def absolute_script(target: tuple[str, ...], cwd: str) -> tuple[str, ...]:
    """When probes run elsewhere, the script path must still point at the user's file."""
    first = target[0]
    if os.path.isfile(first) and cwd != os.getcwd():
        return (os.path.abspath(first), *target[1:])
    return target
