"""Metering for Python processes autotune did not start itself: ``python -m pkg.train``,
``./run.sh`` that runs ``python train.py``, a launcher script that starts its workers, the ranks
a script starts with ``torch.multiprocessing.spawn``.

The controller puts ``probes/site`` first on every rank's ``PYTHONPATH``; its ``sitecustomize``
calls `activate` in every Python process the rank starts. When the autotune channel is in the
environment, the meter and the knob interception start (`probes.boot.start`) the moment the
process imports torch, so a process that never imports torch (a shell helper, ``pip``, another
Python without torch) costs nothing and is never counted. Left alone:

* processes started through ``python -m probes.boot`` (the runner starts the meter itself);
* multiprocessing's resource tracker;
* torch's own tools: ``python -m torch...``, scripts inside the installed torch package (the
  compile workers of ``torch.compile``) and ``torchrun`` (the launcher, not a rank: the workers
  it starts are metered each).

Children of multiprocessing's *spawn* and *forkserver* start methods cannot tell at start-up
what they are: the ranks of ``torch.multiprocessing.spawn`` are such children, and so are
DataLoader workers with a spawn context, which must stay unmetered and keep the one thread torch
gives them. So in those the meter waits (`_WhenTraining`): it starts the first time the process,
past multiprocessing's bootstrap, does what training does and a DataLoader worker never does
(builds or iterates a DataLoader, initialises ``torch.distributed``, wraps a model in DDP, runs
backward or an optimizer step), and the knobs apply to that very call. DataLoader workers
(`role`) and processes that never train are left as they are.

An uncaught exception is reported (out of memory flagged) before the usual traceback (in such a
child: as it leaves, with what multiprocessing caught), and the last counts and the goodbye are
sent at exit.
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import threading

from probes import protocol

_SKIP_MODULES = ("probes.boot", "torch.")

NOW = "now"  # metered from the moment it imports torch
WHEN_TRAINING = "when-training"  # a multiprocessing child: metered once it shows it trains

TRAINING = "training"
HELPER = "helper"
LOADER_WORKER_TARGET = "torch.utils.data._utils.worker._worker_loop"


def _module_run(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv[1:], start=1):
        if arg == "-m":
            return argv[i + 1] if i + 1 < len(argv) else None
        if arg.startswith("-m") and len(arg) > 2:
            return arg[2:]
        if arg in ("-c",) or not arg.startswith("-"):
            return None
    return None


def start_method(argv: list[str]) -> str | None:
    """``"spawn"`` or ``"forkserver"`` for a child of that multiprocessing start method (and for
    the fork server itself, whose forks run the children), else None. Pure."""
    if any(a.startswith("from multiprocessing.forkserver") for a in argv):
        return "forkserver"
    if "--multiprocessing-fork" in argv:
        return "spawn"
    return None


def plan(argv: list[str], env) -> str | None:
    """How a process with this command line (``sys.orig_argv``) and env is metered: `NOW`,
    `WHEN_TRAINING`, or None (never). Pure."""
    if not env.get(protocol.ENV_ADDR):
        return None
    if start_method(argv) is not None:
        return WHEN_TRAINING
    if any(a.startswith("from multiprocessing") for a in argv):
        return None  # the resource tracker
    module = _module_run(argv)
    if module is not None and (module == "probes.boot" or module.startswith(_SKIP_MODULES)):
        return None
    first_script = next((a for a in argv[1:] if not a.startswith("-")), "")
    parts = os.path.normpath(first_script).split(os.sep) if first_script else []
    if any(a in ("site-packages", "dist-packages") and b == "torch"
           for a, b in zip(parts, parts[1:])):
        return None
    return None if os.path.basename(first_script) == "torchrun" else NOW


def role(*, bootstrapped: bool, target: str | None, loader_worker: bool) -> str | None:
    """What a spawn/forkserver child is, asked when it first does what training does.

    ``bootstrapped``: multiprocessing runs the child's own process object (not yet while it
    re-imports the parent's main module, whose top-level code runs in DataLoader workers too);
    ``target``: that object's target as ``module.qualname`` (None: a subclass's own ``run``);
    ``loader_worker``: torch's ``get_worker_info()`` is set. Returns `TRAINING`, `HELPER` (never
    metered) or None (cannot tell yet: ask again at the next call). Pure.
    """
    if loader_worker or target == LOADER_WORKER_TARGET:
        return HELPER
    if not bootstrapped:
        return None
    return TRAINING


def exit_status(exc: BaseException | None) -> tuple[int, BaseException | None]:
    """A multiprocessing child leaving with ``exc`` in flight: its exit code and the exception
    to report (None: nothing failed). ``sys.exit(1)`` after a caught error (what
    ``torch.multiprocessing.spawn`` does) reports the caught error. Pure."""
    if exc is None:
        return 0, None
    if isinstance(exc, SystemExit):
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        cause = exc.__context__
        return code, cause if code and isinstance(cause, Exception) else None
    if isinstance(exc, KeyboardInterrupt):
        return 1, None
    return 1, exc


class _AfterTorch:
    """A meta path finder that calls ``then()`` right after ``torch`` is imported."""

    def __init__(self, then):
        self.then = then

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
        then = self.then

        def exec_then_start(module):
            exec_module(module)
            then()

        loader.exec_module = exec_then_start
        return spec


def activate(env=None) -> bool:
    """Called by ``sitecustomize`` at interpreter start-up; True when metering is armed."""
    env = os.environ if env is None else env
    argv = list(getattr(sys, "orig_argv", sys.argv))
    how = plan(argv, env)
    if how is None:
        return False
    then = _start if how == NOW else _WhenTraining(start_method(argv)).install
    if "torch" in sys.modules:
        then()
    else:
        sys.meta_path.insert(0, _AfterTorch(then))
    return True


def _start() -> None:
    from probes import boot

    try:
        meter = boot.start()
    except Exception as exc:  # noqa: BLE001 - the script must run, measured or not
        _not_started(exc)
        return
    state = {"exit_code": 0}
    previous = sys.excepthook

    def excepthook(kind, exc, tb):
        state["exit_code"] = 130 if issubclass(kind, KeyboardInterrupt) else 1
        if not issubclass(kind, KeyboardInterrupt):
            meter.send(protocol.ERROR, **boot.error_report(exc))
        previous(kind, exc, tb)

    sys.excepthook = excepthook

    def leave():
        if state["exit_code"] == 0:
            boot.end_group_left_open(meter)
        meter.close(exit_code=state["exit_code"])

    atexit.register(leave)


def _not_started(exc: BaseException) -> None:
    print(f"autotune: WARNING: the meter did not start ({type(exc).__name__}: {exc}); "
          f"the script runs unmeasured", file=sys.stderr)


class _WhenTraining:
    """The lazy start of a spawn/forkserver child: hooks on what training does, which start the
    meter at their first call in a training process, then hand that call to the interception.

    The hooks are taken off again once the child is known (the interception then patches the
    originals, as in any rank); a reference the script took earlier (``from torch.distributed
    import init_process_group``) still reaches the interception.
    """

    def __init__(self, method: str | None):
        self.method = method or "spawn"
        self.lock = threading.RLock()
        self.settled = False  # known: started, or left alone for good
        self.patches: list[tuple[object, str, object]] = []

    def install(self) -> None:
        import torch
        from torch.nn.parallel import DistributedDataParallel
        from torch.optim.optimizer import register_optimizer_step_pre_hook
        from torch.utils.data import DataLoader

        self._hook(DataLoader, "__init__")
        self._hook(DataLoader, "__iter__")
        self._hook(DistributedDataParallel, "__init__")
        self._hook(torch.Tensor, "backward")
        if torch.distributed.is_available():
            self._hook(torch.distributed, "init_process_group")

        def before_step(optimizer, args, kwargs):
            if not self.settled:  # the interception's step hook, added now, counts this step
                self.check()

        register_optimizer_step_pre_hook(before_step)

    def _hook(self, owner, name: str) -> None:
        original = getattr(owner, name)
        gate = self

        @functools.wraps(original)
        def hooked(*args, **kwargs):
            if not gate.settled:
                gate.check()
            if gate.settled:
                current = getattr(owner, name)
                if current is not hooked:
                    return current(*args, **kwargs)
            return original(*args, **kwargs)

        setattr(owner, name, hooked)
        self.patches.append((owner, name, original))

    def check(self) -> None:
        """Start the meter if this process is now known to train; leave it alone for good if
        it is known not to."""
        with self.lock:
            if self.settled:
                return
            try:
                verdict = _role_here()
            except Exception as exc:  # noqa: BLE001 - the script must run, measured or not
                verdict = HELPER
                _not_started(exc)
            if verdict is None:
                return
            self.settled = True
            for owner, name, original in self.patches:
                setattr(owner, name, original)
            if verdict == TRAINING:
                _start_child(self.method)


def _role_here() -> str | None:
    """This child's `role`, read from multiprocessing and torch."""
    import multiprocessing

    from torch.utils.data import get_worker_info

    from probes.meter import target_name

    current = multiprocessing.current_process()
    target = target_name(getattr(current, "_target", None))
    # Until its bootstrap runs the child's own process object, multiprocessing's current
    # process is the placeholder every interpreter starts with.
    bootstrapped = type(current).__name__ != "_MainProcess"
    return role(bootstrapped=bootstrapped, target=target,
                loader_worker=get_worker_info() is not None)


def _start_child(method: str) -> None:
    """Start the meter in a spawn/forkserver child that trains; report how it ends.

    Such a child leaves through ``os._exit`` after multiprocessing's own exception handling, so
    neither atexit nor ``sys.excepthook`` run; its finalizers do, with the way out in flight.
    """
    from multiprocessing import util

    from probes import boot
    from probes.meter import started_by_script

    try:
        meter = boot.start(sub=True)
    except Exception as exc:  # noqa: BLE001 - the script must run, measured or not
        _not_started(exc)
        return
    meter.send(protocol.SEEN, **started_by_script(method))

    def leave():
        code, cause = exit_status(sys.exc_info()[1])
        if cause is not None and not meter.stopped_by_us:
            meter.send(protocol.ERROR, **boot.error_report(cause))
        meter.close(exit_code=0 if meter.stopped_by_us else code)

    util.Finalize(None, leave, exitpriority=0)
