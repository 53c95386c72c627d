"""Metering for Python processes autotune did not start itself: ``python -m pkg.train``,
``./run.sh`` that runs ``python train.py``, a launcher script that starts its workers.

The controller puts ``probes/site`` first on every rank's ``PYTHONPATH``; its ``sitecustomize``
calls `activate` in every Python process the rank starts. When the autotune channel is in the
environment, the meter and the knob interception start (`probes.boot.start`) the moment the
process imports torch, so a process that never imports torch (a shell helper, ``pip``, another
Python without torch) costs nothing and is never counted. Left alone:

* processes started through ``python -m probes.boot`` (the runner starts the meter itself);
* multiprocessing's helpers: spawn/forkserver children (DataLoader workers with a spawn context
  among them; they must keep the one thread torch gives them) and the resource tracker;
* torch's own tools: ``python -m torch...``, scripts inside the installed torch package (the
  compile workers of ``torch.compile``) and ``torchrun`` (the launcher, not a rank: the workers
  it starts are metered each).

An uncaught exception is reported (out of memory flagged) before the usual traceback, and the
last counts and the goodbye are sent at exit.
"""

from __future__ import annotations

import atexit
import os
import sys

from probes import protocol

_SKIP_MODULES = ("probes.boot", "torch.")


def _module_run(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv[1:], start=1):
        if arg == "-m":
            return argv[i + 1] if i + 1 < len(argv) else None
        if arg.startswith("-m") and len(arg) > 2:
            return arg[2:]
        if arg in ("-c",) or not arg.startswith("-"):
            return None
    return None


def should_start(argv: list[str], env) -> bool:
    """Whether a process with this command line (``sys.orig_argv``) and env is metered. Pure."""
    if not env.get(protocol.ENV_ADDR):
        return False
    if "--multiprocessing-fork" in argv or any(a.startswith("from multiprocessing")
                                               for a in argv):
        return False
    module = _module_run(argv)
    if module is not None and (module == "probes.boot" or module.startswith(_SKIP_MODULES)):
        return False
    first_script = next((a for a in argv[1:] if not a.startswith("-")), "")
    parts = os.path.normpath(first_script).split(os.sep) if first_script else []
    if any(a in ("site-packages", "dist-packages") and b == "torch"
           for a, b in zip(parts, parts[1:])):
        return False
    return os.path.basename(first_script) != "torchrun"


class _StartWithTorch:
    """A meta path finder that starts the meter right after ``torch`` is imported."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        spec = None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if find is not None:
                spec = find(name, path, target)
                if spec is not None:
                    break
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_start(module):
            exec_module(module)
            _start()

        loader.exec_module = exec_then_start
        return spec


def activate(env=None) -> bool:
    """Called by ``sitecustomize`` at interpreter start-up; True when metering is armed."""
    env = os.environ if env is None else env
    argv = list(getattr(sys, "orig_argv", sys.argv))
    if not should_start(argv, env):
        return False
    if "torch" in sys.modules:
        _start()
    else:
        sys.meta_path.insert(0, _StartWithTorch())
    return True


def _start() -> None:
    from probes import boot

    try:
        meter = boot.start()
    except Exception as exc:  # noqa: BLE001 - the script must run, measured or not
        print(f"autotune: WARNING: the meter did not start ({type(exc).__name__}: {exc}); "
              f"the script runs unmeasured", file=sys.stderr)
        return
    state = {"exit_code": 0}
    previous = sys.excepthook

    def excepthook(kind, exc, tb):
        state["exit_code"] = 130 if issubclass(kind, KeyboardInterrupt) else 1
        if not issubclass(kind, KeyboardInterrupt):
            meter.send(protocol.ERROR, **boot.error_report(exc))
        previous(kind, exc, tb)

    sys.excepthook = excepthook
    atexit.register(lambda: meter.close(exit_code=state["exit_code"]))
