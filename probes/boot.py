"""``python -m probes.boot SCRIPT ARGS...``: run a script as ``python SCRIPT ARGS...`` would, metered.

Like torchrun's script runner: ``runpy.run_path`` as ``__main__`` with ``sys.argv`` patched and
``sys.path[0]`` set to the script's directory; the working directory is left alone. Before the
script starts, knobs from the environment are applied and the meter connects to the controller.
Exit codes are the script's: ``sys.exit(n)`` gives n, an uncaught exception gives 1 after the
usual traceback. A clean stop asked for by the controller exits 0.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from typing import NoReturn

from probes import protocol, ranks_env, writes
from probes.intercept import Interceptor, knobs_from_env
from probes.meter import SUBPROCESS, Meter, started_by_script

OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory",
               "DefaultCPUAllocator", "CUDA error: out of memory")


def is_oom(exc: BaseException) -> bool:
    """True for the ways torch and Python report running out of device or host memory."""
    if isinstance(exc, MemoryError):
        return True
    if type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc)
    return any(marker in text for marker in OOM_MARKERS)


def _dead_worker_error() -> RuntimeError | None:
    """torch's own error when a DataLoader worker of this process died, else None."""
    try:
        from torch._C import _error_if_any_worker_fails
    except ImportError:
        return None
    try:
        _error_if_any_worker_fails()
    except RuntimeError as exc:
        return exc
    return None


def error_report(exc: BaseException) -> dict:
    """The ``error`` message fields for an uncaught exception.

    A killed loader worker often surfaces first as a ConnectionResetError or EOFError from the
    tensor hand-over; torch's own "DataLoader worker ... is killed" names the real cause.
    """
    named = getattr(exc, "_autotune_cause", None)  # set by the loader hook (probes.intercept)
    if named:
        return {"kind": "exception", "exc_type": type(exc).__name__,
                "message": f"{named} ({exc})"[:2000]}
    if isinstance(exc, (ConnectionError, EOFError, RuntimeError)):
        cause = _dead_worker_error()
        if cause is not None:
            exc = cause
    kind = "oom" if is_oom(exc) else \
        protocol.ERROR_STOP_ITERATION if ran_out(exc) else "exception"
    return {"kind": kind, "exc_type": type(exc).__name__, "message": str(exc).strip()[:2000]}


def ran_out(exc: BaseException) -> bool:
    """An iterator the script pulled with ``next`` had nothing left: the uncaught
    StopIteration that ends a ``while True: next(it)`` loop, or the RuntimeError a generator
    turns it into (PEP 479)."""
    return isinstance(exc, StopIteration) or (
        isinstance(exc, RuntimeError) and isinstance(exc.__cause__, StopIteration))


GROUP_LEFT_OPEN = (
    "the script ended with its torch.distributed process group still open; autotune ended it "
    "(destroy_process_group()), as torch asks every script to: left to the interpreter's exit, "
    "a gloo group aborts about one exit in ten (SIGABRT), which a launcher reports as the "
    "rank's failure, so the script run without autotune should call it at its end")


def end_group_left_open(meter: Meter) -> bool:
    """After a script that ended well (exit 0): end the process group it left open, and say so
    (a ``seen`` note). The script is done with it. torch asks every script to end its group:
    one left to the interpreter's exit is torn down in C++'s static destructors, where gloo's
    threads abort about one exit in ten ("terminate called without an active exception"),
    and srun or torchrun then report a rank that finished its work as failed. Never imports
    torch for a script that did not."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return False
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - the script's own exit goes on as it would have
        return False
    meter.group_started = True
    meter.send(protocol.SEEN, note=GROUP_LEFT_OPEN)
    return True


def leave(code: int) -> NoReturn:
    """Exit with ``code``, the script's, as ``python SCRIPT`` would; after a clean end of a
    process that started a torch.distributed group, short of the interpreter's teardown
    (`exit_before_teardown`)."""
    meter = _started.get(os.getpid())
    if code == 0 and meter is not None and meter.group_started:
        exit_before_teardown(code)
    for stream in (sys.stdout, sys.stderr):
        _flush(stream)
    sys.exit(code)


def exit_before_teardown(code: int) -> NoReturn:
    """Do what the interpreter's exit does before its teardown, then end the process.

    Python's exit waits for the threads the script left running, runs the atexit functions and
    flushes; then it tears the interpreter down, collecting what is left. A torch.distributed
    group's native threads can outlive the script: gloo's worker thread lets go of a finished
    work after it has woken the main thread, and on a busy machine the main thread may be in the
    teardown by then. The Python object that work holds then takes the lock of an interpreter
    being torn down, which ends the thread by unwinding it through C++ that may not unwind:
    "terminate called without an active exception", SIGABRT, after the script's last step. A
    core dump of one such exit (plain torchrun, 2 gloo ranks of
    tests/scripts/shape_ddp_when_launched.py, which calls destroy_process_group) showed the
    main thread in the teardown's collection and gloo's worker in that unwinding, from
    ``~AsyncAllreduceWork``: 2 of 25 plain exits here, and a rank under srun in CI. A collection
    before the exit cannot help (the work is the worker's to let go of); not tearing down can.
    So here the same steps run while the interpreter is whole, every file still open is
    flushed, and ``os._exit`` ends the process with the script's code.
    """
    import atexit
    import gc
    import threading

    # what the interpreter's exit calls first (every Python from 3.10 has it): the threading
    # module's own exit functions (a thread pool's idle workers are told to end there; joined
    # before it, they wait forever), then every non-daemon thread joined
    threading._shutdown()
    atexit._run_exitfuncs()
    # every open file flushed before the collection and after it: a collected cycle closes
    # its files in any order, a file's buffer after its descriptor at times (its data lost)
    _flush_open_files()
    gc.collect()  # finalizers run as the teardown's collection would run them
    _flush_open_files()
    _finalize_mpi()
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)  # C libraries' own buffered output
    except Exception:  # noqa: BLE001 - nothing of C's stdio to flush, or no libc to ask
        pass
    os._exit(code)


def _finalize_mpi() -> None:
    """``MPI_Finalize`` where mpi4py initialized MPI: mpi4py leaves it to a hook of the
    teardown, and Open MPI's mpirun fails a job whose process exited without it."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None:
        return
    try:
        if mpi.Is_initialized() and not mpi.Is_finalized():
            mpi.Finalize()
    except Exception:  # noqa: BLE001 - MPI's own error at its end: the exit goes on
        pass


def _flush_open_files() -> None:
    """Flush every file object still open in this process, the standard streams among them."""
    import gc
    import io

    for obj in gc.get_objects():
        if issubclass(type(obj), io.IOBase):  # by type: no attribute of obj is read
            _flush(obj)
    for stream in (sys.stdout, sys.stderr):  # replaced streams need not be io objects
        _flush(stream)


def _flush(stream) -> None:
    """Flush an open, writable file object; one that cannot be flushed is left as it is."""
    try:
        if stream is not None and not stream.closed and stream.writable():
            stream.flush()
    except Exception:  # noqa: BLE001 - a closed pipe, a full disk: as at any exit
        pass


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1


_started: dict[int, Meter] = {}  # pid -> its meter: one start per process, whoever asks


def start(env=None, *, sub: bool = False) -> Meter:
    """Connect the meter and install the hooks; used by the runner and by sitecustomize.

    First the rank's identity and placement (`probes.ranks_env`): under mpirun or srun the
    torchrun variables are derived from the launcher's, and thread/core settings must be in
    place before torch loads. ``sub``: a training process the script started itself (its hello
    says so). A second call in the same process returns the first meter.
    """
    pid = os.getpid()
    if pid in _started:
        return _started[pid]
    ranks_env.apply(os.environ if env is None else env)
    meter = Meter(env)
    _started[pid] = meter
    meter.connect(sub=sub)
    parent = meter.env.get(protocol.ENV_METERED_PID)
    if not sub and parent and parent != str(pid):
        meter.send(protocol.SEEN, **started_by_script(SUBPROCESS))
    os.environ[protocol.ENV_METERED_PID] = str(pid)
    Interceptor(meter, knobs_from_env(meter.env)).install()
    writes.watch(meter, meter.env)
    return meter


def run(script: str, args: list[str]) -> int:
    """Run ``script`` under the meter; returns the exit code ``python script`` would have."""
    if not os.path.exists(script):
        print(f"python: can't open file {script!r}: [Errno 2] No such file or directory",
              file=sys.stderr)
        return 2
    meter = start()
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = 0 if meter.stopped_by_us else _exit_code(exc)
        if code and not isinstance(exc.code, int) and exc.code is not None:
            print(exc.code, file=sys.stderr)
    except KeyboardInterrupt:
        meter.close(exit_code=130)
        raise
    except BaseException as exc:  # noqa: BLE001 - reported, then exits as Python would
        meter.send(protocol.ERROR, **error_report(exc))
        traceback.print_exc()
        code = 1
    if code == 0:
        end_group_left_open(meter)
    meter.close(exit_code=code)
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m probes.boot SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    return run(argv[0], argv[1:])


if __name__ == "__main__":
    leave(main())
