"""``autotune`` command line: parse, dispatch to `autotune.commands`, turn errors into one line.

Usage errors exit 2 with one line and no traceback; other autotune errors exit 1 with one line.
"""

from __future__ import annotations

import argparse
import importlib
import re
import signal
import sys

from autotune.monitor import console
from autotune import AutotuneError, Terminated, UsageError

COMMANDS = ("probe", "tune", "wrap", "run", "monitor", "recipes", "report", "env", "ps", "logs",
            "stop")


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting."""

    def error(self, message):
        raise UsageError(f"{self.prog}: {message} (see '{self.prog} --help')")


def _command_of(argv: list[str] | None) -> str | None:
    """The command ``argv`` names (its first word: autotune's own options are only --help and
    --version), or None when it names none of `COMMANDS`."""
    first = next((a for a in argv or () if not a.startswith("-")), None)
    return first if first in COMMANDS else None


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The whole command line; given the ``argv`` it will parse, only the command that names
    is imported (the others stay names: ``autotune ps`` does not pay for Optuna's import, a
    second and a half of CPU)."""
    parser = _Parser(prog="autotune", description=(
        "Measure an unmodified PyTorch training script, tune its system knobs, run it."))
    from autotune import __version__
    parser.add_argument("--version", action="version", version=f"autotune {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    wanted = _command_of(argv)
    for name in COMMANDS:
        if wanted is not None and name != wanted:
            sub.add_parser(name)  # not parsed in this call: a name only
            continue
        try:
            module = importlib.import_module(f"autotune.commands.{name}")
        except ImportError as exc:
            if exc.name == f"autotune.commands.{name}":
                continue  # not built yet
            package = _package_of(exc)
            if package is None or package in ("autotune", "probes"):
                raise
            _add_missing(sub, name, package, exc)
            continue
        p = module.add_parser(sub)
        p.set_defaults(_run=module.run)
    return parser


def _package_of(exc: ImportError) -> str | None:
    """The top-level package an import failed in: the module Python names, or the one its
    message names (a package that raises ImportError itself, half installed)."""
    name = exc.name
    if not name:
        found = re.search(r"No module named '?([A-Za-z_][\w.]*)", str(exc))
        name = found.group(1) if found else None
    return name.split(".")[0] if name else None


def _add_missing(sub, name: str, package: str, exc: ImportError) -> None:
    """A command whose dependency is not installed: the other commands still work, and this one
    says what is missing instead of a traceback (a GPU host often lacks optuna, say)."""
    p = sub.add_parser(name, add_help=False, help=f"(needs the package {package!r})")
    p.add_argument("rest", nargs=argparse.REMAINDER)

    def missing(_args) -> int:
        raise AutotuneError(f"autotune {name} needs the Python package {package!r} "
                            f"({type(exc).__name__}: {exc}): "
                            f"{sys.executable} -m pip install {package.replace('_', '-')}")

    p.set_defaults(_run=missing)


def _terminate(signum, frame):
    raise Terminated(signum)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from autotune.commands import detach

    # A closed terminal (SIGHUP) or a kill (SIGTERM) must clean up like Ctrl-C does; commands
    # that forward signals to a run install their own handlers for its duration. A detached
    # controller (`autotune.commands.detach`) ignores SIGHUP instead.
    daemon = detach.become_daemon()
    for sig in (signal.SIGTERM,) if daemon else (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _terminate)
    command = ""
    try:
        parser = build_parser(argv)
        args = parser.parse_args(argv)
        command = getattr(args, "command", "") or ""
        if not getattr(args, "_run", None):
            parser.print_help()
            return 2
        if getattr(args, "detach", False) and not daemon:
            return detach.start(args, list(argv))
        return int(args._run(args) or 0)
    except AutotuneError as exc:
        console.error(str(exc))
        return exc.exit_code
    except Terminated as exc:
        console.error(f"stopped by {signal.Signals(exc.signum).name}; every process of the run "
                      f"was stopped")
        if exc.signum == signal.SIGHUP and command in ("tune", "wrap", "run"):
            console.hint(f"the terminal closed; 'autotune {command} -d ...' starts a run that "
                         f"outlives its terminal")
        return 128 + exc.signum
    except KeyboardInterrupt:
        console.error("interrupted; every process of the run was stopped")
        return 130


if __name__ == "__main__":
    sys.exit(main())
