"""Knob interception and metering hooks, installed into torch before the user's script runs.

Knobs arrive in the environment (`probes.protocol.KNOB_ENV`). The rules torch itself enforces
are kept: a DataLoader built with a ``batch_sampler`` (or ``batch_size=None``) has no batch size
to change; ``num_workers=0`` admits neither ``prefetch_factor`` nor ``persistent_workers``.
Every decision is reported to the controller as a ``seen`` message.
"""

from __future__ import annotations

import functools
import inspect
import os
import signal
import socket
import sys
import time
import weakref

from probes import protocol
from probes.meter import PID, Meter


def knobs_from_env(env=None) -> dict[str, float]:
    """The knob values the controller asked for; malformed values are ignored with a warning."""
    env = os.environ if env is None else env
    knobs = {}
    for name, var in protocol.KNOB_ENV.items():
        raw = env.get(var)
        if raw in (None, ""):
            continue
        try:
            knobs[name] = float(raw) if name == "bucket_mb" else int(raw)
        except ValueError:
            print(f"autotune: WARNING: ignoring {var}={raw!r}: not a number", file=sys.stderr)
    return knobs


DEAD_WORKER_WAIT_S = 0.5


def _name_dead_worker(it, exc: BaseException) -> None:
    """A loader worker killed mid-batch first shows as a reset connection; name the real cause.

    The socket closes a moment before the process is reported dead, so wait briefly for it.
    The exception the script sees is unchanged; the cause rides on it for the meter's report.
    """
    workers = getattr(it, "_workers", None) or []
    deadline = time.monotonic() + DEAD_WORKER_WAIT_S
    while True:
        for w in workers:
            code = w.exitcode
            if code is not None and code < 0:
                try:
                    name = signal.Signals(-code).name
                except ValueError:
                    name = f"signal {-code}"
                exc._autotune_cause = f"DataLoader worker (pid {w.pid}) was killed by {name}"
                return
        if time.monotonic() >= deadline:
            return
        time.sleep(0.01)


def apply_loader_knobs(arguments: dict, knobs: dict) -> tuple[dict, list[str]]:
    """New DataLoader arguments with the knobs applied, and notes on what could not be.

    Pure: takes and returns the bound ``__init__`` arguments (after defaults were applied).
    """
    args = dict(arguments)
    notes = []
    if "batch_size" in knobs:
        if args.get("batch_sampler") is not None:
            notes.append("batch_size not applied: the DataLoader has a batch_sampler")
        elif args.get("batch_size") is None:
            notes.append("batch_size not applied: the DataLoader disables automatic batching")
        else:
            args["batch_size"] = knobs["batch_size"]
    if "workers" in knobs:
        workers = int(knobs["workers"])
        args["num_workers"] = workers
        if workers == 0:
            if args.get("prefetch_factor") is not None:
                args["prefetch_factor"] = None
                notes.append("prefetch_factor dropped: torch allows it only with workers > 0")
            if args.get("persistent_workers"):
                args["persistent_workers"] = False
                notes.append("persistent_workers off: torch allows it only with workers > 0")
    if int(args.get("num_workers") or 0) > 0:  # torch takes these only with workers
        if "prefetch" in knobs:
            args["prefetch_factor"] = int(knobs["prefetch"])
        if "persistent" in knobs:
            args["persistent_workers"] = bool(knobs["persistent"])
    if "pin_memory" in knobs:
        args["pin_memory"] = bool(knobs["pin_memory"])
    return args, notes


def loader_facts(args: dict) -> dict:
    """What a DataLoader's (bound) arguments say of the knobs, in the knobs' own terms:
    prefetch_factor None means torch's 2 once there are workers."""
    workers = args.get("num_workers")
    prefetch = args.get("prefetch_factor")
    try:  # samples in an epoch, when the dataset knows (an iterable one may not)
        dataset_len = len(args.get("dataset"))
    except Exception:  # noqa: BLE001 - a dataset's __len__ may raise anything
        dataset_len = None
    return {"batch_size": args.get("batch_size"), "workers": workers,
            "prefetch": prefetch if prefetch is not None else (2 if workers else None),
            "persistent": int(bool(args.get("persistent_workers"))),
            "pin_memory": int(bool(args.get("pin_memory"))), "dataset_len": dataset_len}


def override_backend(asked, override: str | None, *, nccl_why_not: str = "") -> tuple[object, str]:
    """The backend to use instead of ``asked``, and a note saying why ("" when unchanged).

    The controller sets ``AUTOTUNE_BACKEND_OVERRIDE`` when ranks share a GPU: NCCL refuses two
    ranks on one GPU in one communicator, so an NCCL request (or none, which picks NCCL when CUDA
    is there) becomes the override. ``nccl_why_not`` says why NCCL cannot serve this process at
    all (a CPU-only torch or host): an explicit NCCL request then becomes gloo, as the plain run
    on such a host would need. Any other choice of the script (gloo, mpi) is kept.
    """
    text = "" if asked is None else str(asked).lower()
    nccl_only = "nccl" in text and "gloo" not in text and "mpi" not in text
    if override and (asked is None or "nccl" in text):
        said = "no backend" if asked is None else f"backend {str(asked)!r}"
        return override, (f"the script asked for {said}; ranks share a GPU and NCCL refuses two "
                          f"ranks on one GPU ('Duplicate GPU detected'), so autotune used "
                          f"{override!r}")
    if nccl_why_not and nccl_only:
        return "gloo", (f"the script asked for backend {str(asked)!r}, which cannot serve here "
                        f"({nccl_why_not}), so autotune used 'gloo'")
    return asked, ""


SOLO_NOTE = ("one rank runs as 'python train.py' does, without torchrun's variables; the "
             "script's init_process_group got a world of one (RANK=0, WORLD_SIZE=1), as under "
             "'torchrun --nproc_per_node 1'")


def solo_world(arguments: dict, env) -> dict[str, str]:
    """What ``init_process_group`` needs from the environment to start a world of one, when the
    script calls it unconditionally in a rank started without torchrun's variables (a probe of
    one rank runs as ``python train.py``, where such a call fails with "environment variable
    RANK expected"); empty when the call or the environment names its world already. Pure but
    for the free port it picks."""
    method = arguments.get("init_method")
    if arguments.get("store") is not None or (method is not None and method != "env://"):
        return {}
    if "rank" in arguments or "world_size" in arguments or "RANK" in env or \
            "WORLD_SIZE" in env:
        return {}
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": env.get("LOCAL_RANK", "0"),
            "MASTER_ADDR": env.get("MASTER_ADDR", "127.0.0.1"),
            "MASTER_PORT": env.get("MASTER_PORT", str(port))}


def nccl_why_not(torch) -> str:
    """Why NCCL cannot serve this process ("" when it can): no NCCL in this torch, or no GPU."""
    if not torch.distributed.is_nccl_available():
        return "this torch has no NCCL"
    if not torch.cuda.is_available():
        return "no CUDA device in this process"
    return ""


def _world_size(model) -> int:
    """The size of a DDP model's process group (1 when it cannot be told)."""
    try:
        return int(model.process_group.size())
    except Exception:  # noqa: BLE001 - a group we cannot read: no noise scale, nothing broken
        return 1


def real_pace_s(filled: list[tuple[float, float]]) -> float | None:
    """Seconds per batch of the script fed by its real loader, from the (asked, got) times of
    the batches that filled the synthetic cache: from the first batch to the last (the
    script's own work between them included: the pace of the full run), or the one batch's
    fetch when there is only one. None before any."""
    if not filled:
        return None
    if len(filled) == 1:
        return filled[0][1] - filled[0][0]
    return (filled[-1][1] - filled[0][1]) / (len(filled) - 1)


def replayed_epoch_over(*, yielded: int, epoch_len: int | None, started_t: float,
                        pace_s: float | None, now: float) -> bool:
    """Whether a replayed epoch ends before its next batch: it has yielded ``epoch_len``
    batches and the real loader, started at ``started_t`` and yielding a batch every
    ``pace_s``, would have yielded them all by ``now``. A loader without a length (an
    iterable dataset) never ends its epoch; with no pace known it ends at its length."""
    if epoch_len is None or yielded < epoch_len:
        return False
    return pace_s is None or now >= started_t + epoch_len * pace_s


def _on_cpu(model) -> bool | None:
    """Whether a DDP model's parameters are on the CPU (None when it cannot be told)."""
    kind = getattr(model, "device_type", None)
    return None if kind is None else kind == "cpu"


def _in_world() -> bool:
    """This process is a rank of a torch.distributed group of more than one."""
    dist = sys.modules.get("torch.distributed")
    try:
        return bool(dist and dist.is_available() and dist.is_initialized()
                    and dist.get_world_size() > 1)
    except Exception:  # noqa: BLE001 - a group we cannot read: keep torch's own epoch
        return True


class _Held:
    """A loader held strongly, called as a weak reference is."""

    __slots__ = ("loader",)

    def __init__(self, loader):
        self.loader = loader

    def __call__(self):
        return self.loader


def _loader_of(it):
    """The DataLoader that made iterator ``it`` (None when unknown or gone)."""
    ref = getattr(it, "_autotune_loader", None)
    return ref() if ref is not None else None


def _try_set(obj, name: str, value) -> None:
    try:
        setattr(obj, name, value)
    except AttributeError:
        pass


def _try(fn, *args) -> None:
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - measuring never breaks a training step
        pass


def _after(norms, fut):
    """The ``then`` of a hook's future: the averaged bucket's norm, the value passed on as is
    (an allreduce that failed raises here, as it would have without us)."""
    value = fut.value()
    _try(norms.after, value[0] if isinstance(value, (list, tuple)) else value)
    return value


def _then_after(fut, norms):
    """The hook's future, chained to `_after`; as it was when it cannot be (DDP will say why)."""
    try:
        return fut.then(functools.partial(_after, norms))
    except Exception:  # noqa: BLE001 - not a Future: DDP's own error, not ours
        return fut


class Interceptor:
    """Owns the patches on torch for one process."""

    def __init__(self, meter: Meter, knobs: dict):
        self.meter = meter
        self.knobs = knobs
        self.loaders = 0
        self._synthetic_cache: dict[int, list] = {}
        self._synthetic_fill: dict[int, list[tuple[float, float]]] = {}
        self.synthetic_batches = int(
            meter.env.get(protocol.ENV_SYNTHETIC_BATCHES, protocol.DEFAULT_SYNTHETIC_BATCHES))
        self._place_hooks = lambda: None  # the step hooks' (`_install_steps`)

    def install(self) -> None:
        import torch

        self._install_threads(torch)
        self._install_loader(torch)
        self._install_steps(torch)
        self._install_ddp(torch)

    # -- threads --------------------------------------------------------------------------
    def _install_threads(self, torch) -> None:
        threads = self.knobs.get("threads")
        original = torch.set_num_threads
        if threads:
            original(int(threads))
        meter = self.meter
        owner = os.getpid()

        def set_num_threads(n):
            if os.getpid() != owner:  # a forked child (DataLoader workers ask for 1): its own
                return original(n)
            if threads:
                meter.send(protocol.SEEN, what="threads", requested=int(n), applied=int(threads),
                           note="the script's torch.set_num_threads call was overridden by autotune")
                return None
            meter.send(protocol.SEEN, what="threads", requested=int(n), applied=int(n), note="")
            return original(n)

        torch.set_num_threads = set_num_threads

    # -- DataLoader -----------------------------------------------------------------------
    def _install_loader(self, torch) -> None:
        from torch.utils.data import DataLoader
        from torch.utils.data import dataloader as dl

        interceptor = self
        meter = self.meter
        init = DataLoader.__init__
        signature = inspect.signature(init)

        # ``self`` and functools.wraps: frameworks read DataLoader.__init__'s signature to build
        # the loader again (Lightning adds its DistributedSampler so), and must find torch's.
        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            loader = self
            if getattr(loader, "_autotune_tag", None) is not None:  # subclass calling super()
                return init(loader, *args, **kwargs)
            bound = signature.bind(loader, *args, **kwargs)
            bound.apply_defaults()
            requested = dict(bound.arguments)
            applied, notes = apply_loader_knobs(requested, interceptor.knobs)
            loader._autotune_tag = interceptor.loaders
            interceptor.loaders += 1
            bound.arguments.update(applied)
            meter.send(protocol.SEEN, what="dataloader", tag=loader._autotune_tag,
                       requested=loader_facts(requested), applied=loader_facts(applied),
                       note="; ".join(notes))
            return init(*bound.args, **bound.kwargs)

        DataLoader.__init__ = __init__

        base_iter = DataLoader.__iter__
        replays = meter.mode in ("io", "synthetic")

        def __iter__(loader):
            it = base_iter(loader)
            if not replays:  # a full run or probe reads none of these, and every attribute
                return it  # added to the iterator slows torch's own reads of it each batch
            try:
                # A persistent-worker loader holds its iterator: a strong ref back would make a
                # cycle that outlives the script's last use of the loader, so its workers would
                # not be shut down in order (torch's exit hook then waits 5 s for each, on
                # CUDA). Other loaders are held, so that ``for b in DataLoader(...)`` keeps its
                # loader for the io mode's next epoch.
                it._autotune_loader = weakref.ref(loader) \
                    if getattr(loader, "persistent_workers", False) else _Held(loader)
                it._autotune_key = getattr(loader, "_autotune_tag", id(loader))
                it._autotune_yielded = 0
            except AttributeError:
                pass
            return it

        DataLoader.__iter__ = __iter__

        next_ = dl._BaseDataLoaderIter.__next__
        io, synthetic = meter.mode == "io", meter.mode == "synthetic"
        grad_enabled, monotonic, Tensor = torch.is_grad_enabled, time.monotonic, torch.Tensor

        def next_in_full(it):
            """Any batch: the replaying modes', a sampled step's, an evaluation's, the last."""
            m = meter
            if m.stopping:
                m.maybe_stop()
            training = grad_enabled()
            if io and training:
                interceptor._drain(it, next_)  # never returns
            clock = m.clock
            timed = training and clock.timed  # a sampled step (`probes.parts`): the others
            start = monotonic() if timed else 0.0  # mark nothing
            try:
                if synthetic and training:
                    batch = interceptor._replay(it, next_)
                else:
                    batch = next_(it)
            except (ConnectionError, EOFError) as exc:
                _name_dead_worker(it, exc)
                raise
            if training:
                end = monotonic()
                if timed:
                    clock.data(start, end)
                m.count_batch(batch, True, end)
            else:
                m.count_batch(batch, False)
            return batch

        if replays:
            dl._BaseDataLoaderIter.__next__ = next_in_full
            return

        # Every batch of a full run or probe passes here, inside the script's loop, where each
        # bytecode costs (`bench/hook_cost.py`): a training batch between sampled steps is
        # counted inline, as `Meter.count_batch` counts it, its size read as `batch_len` reads
        # a tensor or an ``(inputs, targets)`` pair; every other batch goes the whole way.
        def __next__(it):
            m = meter
            if not m.fast or not grad_enabled():
                return next_in_full(it)
            try:
                batch = next_(it)
            except (ConnectionError, EOFError) as exc:
                _name_dead_worker(it, exc)
                raise
            kind = type(batch)
            if kind is tuple or kind is list:
                first = batch[0] if batch else None
                shape = first.shape if type(first) is Tensor else None
                n = shape[0] if shape else 0
            elif kind is Tensor:
                shape = batch.shape
                n = shape[0] if shape else 1
            else:
                n = 0
            if n and PID[0] == m.pid:
                m.samples += n
                m.batches += 1
                m.last_batch_t = now = monotonic()
                if not m.tick_first_batch_t:
                    m.tick_first_batch_t = now
                    if not m.first_batch_t:
                        m.first_batch_t = now
            else:
                m.count_batch(batch, True)
            return batch

        dl._BaseDataLoaderIter.__next__ = __next__

    def _replay(self, it, next_):
        """Synthetic mode: the first batches come from the loader, then are replayed (no I/O).

        A replayed epoch ends where the script fed by its real loader would have reached the
        end (`replayed_epoch_over`): never before ``len(loader)`` batches, and never sooner in
        time than the real loader, at the pace the script took the batches that filled the
        cache. So the script's data runs out no sooner than in full mode and the probe measures
        as long as a full one can (a ``next(it)`` loop over a finite loader used to end the
        script within seconds, as the replay outran the real loader), and per-epoch work
        (evaluation, checkpoints) comes at the real epochs' cadence, taking the same share of
        the time as in full mode. An epoch may thus hold more than ``len(loader)`` batches.
        In a process group of several ranks the epoch ends at ``len(loader)`` as torch's does:
        each rank's pace is its own, and ranks whose epochs ended at different steps would meet
        in different collectives.
        """
        key = getattr(it, "_autotune_key", None)
        cache = self._synthetic_cache.setdefault(key, [])
        filled = self._synthetic_fill.setdefault(key, [])  # (asked, got) of each cached batch
        yielded = getattr(it, "_autotune_yielded", 0)
        now = time.monotonic()
        if yielded == 0:
            _try_set(it, "_autotune_epoch_t", now)
        try:
            epoch_len = len(it)
        except TypeError:
            epoch_len = None
        if epoch_len is not None and yielded >= epoch_len and replayed_epoch_over(
                yielded=yielded, epoch_len=epoch_len,
                started_t=getattr(it, "_autotune_epoch_t", now),
                pace_s=None if _in_world() else real_pace_s(filled), now=now):
            raise StopIteration
        if len(cache) < self.synthetic_batches:
            batch = next_(it)
            filled.append((now, time.monotonic()))
            cache.append(batch)
        else:
            batch = cache[yielded % len(cache)]
        it._autotune_yielded = yielded + 1
        return batch

    def _drain(self, it, next_):
        """I/O mode: take over at the first training batch and only pull from the loader."""
        meter = self.meter
        loader = _loader_of(it)
        while True:
            got = 0
            while True:
                meter.maybe_stop()
                try:
                    batch = next_(it)
                except StopIteration:
                    break
                got += 1
                meter.count_batch(batch, training=True)
            if got == 0 or loader is None:
                raise SystemExit(0)
            it = iter(loader)

    # -- steps ------------------------------------------------------------------------------
    def _install_steps(self, torch) -> None:
        from torch.optim import optimizer as torch_optimizer

        meter = self.meter

        # how many optimizers are inside their step (steps may nest: a wrapper's); a count,
        # not their ids: ``id()`` is an audit event, which the probes' write watch hears
        depth = 0
        nests = False  # a step was seen inside another: the pre-hook stays for good
        monotonic = time.monotonic

        # These run on every step, inside the script's loop: the common case is counted
        # inline, as `Meter.count_step` and `Meter.backward_ended` count it. Between sampled
        # steps (`Meter.fast`) the pre-hook and the backward wrapper are taken out
        # (`place_hooks`): each Python call there cost a 0.5 ms step ~2 us (`bench/hook_cost.py`).
        def before_step(optimizer, args, kwargs):
            nonlocal depth, nests
            m = meter
            if m.noise.seen:
                m.close_backward()
            if depth:
                nests = True
            elif m.clock.timed:
                m.clock.optimizer_begin()
            depth += 1

        def after_step(optimizer, args, kwargs):
            nonlocal depth
            m = meter
            if depth:
                depth -= 1
            chosen = False  # the clock chose whether the next step is timed
            if not depth:  # a step ended: between sampled steps only counted down
                clock = m.clock
                if clock.skip:
                    clock.skip -= 1
                else:
                    clock.optimizer_end()
                    chosen = True
            if PID[0] == m.pid:
                m.steps += 1
                m.last_step_t = now = monotonic()
                if not m.tick_first_step_t:
                    m.tick_first_step_t = now
            else:
                m.count_step()  # a forked child: its counters start afresh, slow
            if chosen:
                m.fast = not (m.stopping or m.clock.timed or m.noise.seen) and PID[0] == m.pid
                place_hooks()
            if m.stopping:
                m.maybe_stop()

        # ``Tensor.backward`` calls ``torch.autograd.backward`` by name: ours goes there, where
        # it can be taken out at the cost of a module's attribute. Swapping ``Tensor.backward``
        # itself cost more than the wrapper: every cached lookup on a tensor is dropped when
        # its class changes (+2.8 us a step at two swaps in 19 steps, `bench/hook_cost.py`).
        autograd = torch.autograd
        backward = autograd.backward

        def autograd_backward(*args, **kwargs):
            m = meter
            clock = m.clock
            if clock.timed:
                clock.backward_begin()
                result = backward(*args, **kwargs)
                clock.backward_end()
            else:
                result = backward(*args, **kwargs)
            if m.steps and not m.noise.seen and PID[0] == m.pid:
                m.backwards += 1
                return result
            m.backward_ended()
            if m.stopping and not m.steps:  # weights updated by hand: a backward
                m.maybe_stop()  # pass ends the step
            return result

        # torch's global pre-hooks by their handles' ids: ours leaves and comes back under its
        # handle's id (the public handle only removes). A torch that keeps them otherwise
        # keeps ours in for good: the steps are counted all the same.
        handle = torch_optimizer.register_optimizer_step_pre_hook(before_step)
        pre_hooks = getattr(torch_optimizer, "_global_optimizer_pre_hooks", None)
        pre_hook = getattr(handle, "id", None)
        movable = isinstance(pre_hooks, dict) and pre_hooks.get(pre_hook) is before_step

        def place_hooks() -> None:
            """The pre-hook and the backward wrapper in for a step that is not `Meter.fast`,
            out for one that is. Between sampled steps of an optimizer neither has anything
            to do: a backward pass's count is read only when no optimizer steps, DDP's
            buckets put the hooks back (`_install_comm_timing`), and the depth of nested
            steps matters only to the clock (a script whose steps nest keeps the pre-hook).
            The wrapper is swapped only while it is ours or torch's: one put there later by
            someone else stays as it is."""
            current = autograd.backward
            if meter.fast:
                if current is autograd_backward:
                    autograd.backward = backward
                if movable and not nests and not depth:
                    pre_hooks.pop(pre_hook, None)
                return
            if current is backward:
                autograd.backward = autograd_backward
            if movable and pre_hook not in pre_hooks:
                pre_hooks[pre_hook] = before_step

        def all_in_child() -> None:  # a forked child's first steps are timed (a new clock)
            meter.fast = False
            place_hooks()

        self._place_hooks = place_hooks
        autograd.backward = autograd_backward
        torch_optimizer.register_optimizer_step_post_hook(after_step)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=all_in_child)

    # -- DDP --------------------------------------------------------------------------------
    def _install_comm_timing(self, DDP) -> None:
        """Time DDP's communication, and take the noise scale's norms where they are asked for.

        A model on the CPU is timed by DDP's own timers in C++ (`probes.ddp_comm`, added when
        it is built): no hook of ours runs there, unless `protocol.ENV_NOISE` asks for the
        norms, which only a hook can take. A CUDA model's bucket launches are timed through its
        communication hook (`probes.parts`). The hook the script registers before its first
        forward pass is wrapped where it must be. Without one, a dispatcher of ours is
        registered at the first forward pass where a hook is needed; it runs DDP's default
        allreduce, or the hook the script registers later (DDP takes one registration only, so
        the later one goes to the dispatcher instead). A model with a built-in (C++) hook
        trains as it would, and so does one that refuses ours, and every model where
        `protocol.ENV_LEAVE_DDP_ALLREDUCE` asks it (the full run).
        """
        interceptor, meter = self, self.meter
        dispatch = meter.env.get(protocol.ENV_LEAVE_DDP_ALLREDUCE) != "1"
        noise = meter.env.get(protocol.ENV_NOISE) == "1"
        register = DDP.register_comm_hook
        builtin = DDP._register_builtin_comm_hook

        def hooked(model) -> tuple[bool, bool]:
            """(marks the bucket launches, takes the norms): what a hook of ours does for
            ``model``; a hook doing neither is not registered or wrapped."""
            # the gradient noise scale's norms (`probes.noise`), when asked for: at one rank
            # there is no second batch to compare with, and they would cost for nothing
            return _on_cpu(model) is not True, noise and _world_size(model) > 1

        def timed(hook, model):
            marks, multi = hooked(model)

            @functools.wraps(hook)
            def timed_hook(state, bucket):
                if marks and meter.clock.timed:
                    meter.clock.bucket_launched()
                if not multi:
                    return hook(state, bucket)
                if meter.fast:  # its norms close at every step's start from here on
                    meter.fast = False
                    interceptor._place_hooks()
                norms = meter.noise
                if not norms.takes(meter.steps):  # not this step's (`noise.SAMPLE_GAP_S`)
                    return hook(state, bucket)
                _try(norms.before, bucket.buffer())  # before the hook divides it in place
                return _then_after(hook(state, bucket), norms)
            return timed_hook

        @functools.wraps(register)
        def register_comm_hook(model, state, hook):
            slot = getattr(model, "_autotune_slot", None)
            if slot is not None:  # ours went first: the script's hook runs through it
                model._check_comm_hook(hook)
                slot[:] = [state, hook]
                return None
            model._autotune_comm = True
            if not any(hooked(model)):
                return register(model, state, hook)
            return register(model, state, timed(hook, model))

        @functools.wraps(builtin)
        def register_builtin_comm_hook(model, comm_hook_type):
            if getattr(model, "_autotune_slot", None) is not None:
                from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

                hook = {"ALLREDUCE": default_hooks.allreduce_hook,
                        "FP16_COMPRESS": default_hooks.fp16_compress_hook}.get(
                    getattr(comm_hook_type, "name", ""))
                if hook is not None:
                    model._autotune_slot[:] = [model.process_group, hook]
                    return None
            model._autotune_comm = True
            return builtin(model, comm_hook_type)

        DDP.register_comm_hook = register_comm_hook
        DDP._register_builtin_comm_hook = register_builtin_comm_hook
        forward = DDP.forward

        @functools.wraps(forward)
        def ddp_forward(model, *args, **kwargs):
            meter.close_backward()  # a backward pass not seen to end ends here
            if dispatch and not getattr(model, "_autotune_comm", False):
                model._autotune_comm = True
                if not any(hooked(model)):  # DDP's own allreduce, timed by DDP
                    return forward(model, *args, **kwargs)
                try:
                    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

                    # the slot, not the model, in the hook's closure: the reducer holds the
                    # hook, and a model reachable from it would never be freed
                    slot = [model.process_group, default_hooks.allreduce_hook]

                    def autotune_dispatch(state, bucket):
                        return slot[1](slot[0], bucket)

                    register(model, None, timed(autotune_dispatch, model))
                    model._autotune_slot = slot
                except Exception:  # noqa: BLE001 - untimed is better than a failed script
                    pass
            return forward(model, *args, **kwargs)

        DDP.forward = ddp_forward

    def _install_ddp(self, torch) -> None:
        from torch.nn.parallel import DistributedDataParallel as DDP

        meter = self.meter
        bucket_mb = self.knobs.get("bucket_mb")
        init = DDP.__init__
        signature = inspect.signature(init)

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            bound = signature.bind(self, *args, **kwargs)
            requested = bound.arguments.get("bucket_cap_mb")
            if bucket_mb:
                bound.arguments["bucket_cap_mb"] = bucket_mb
            meter.send(protocol.SEEN, what="ddp", requested={"bucket_mb": requested},
                       applied={"bucket_mb": bound.arguments.get("bucket_cap_mb")},
                       note="")
            result = init(*bound.args, **bound.kwargs)
            if _on_cpu(self):  # its communication timed by DDP itself (`probes.ddp_comm`)
                meter.ddp_comm.add(self)
            return result

        DDP.__init__ = __init__
        self._install_comm_timing(DDP)

        if torch.distributed.is_available():
            init_pg = torch.distributed.init_process_group
            pg_signature = inspect.signature(init_pg)
            override = meter.env.get(protocol.ENV_BACKEND_OVERRIDE) or None

            @functools.wraps(init_pg)
            def init_process_group(*args, **kwargs):
                bound = pg_signature.bind(*args, **kwargs)
                asked = bound.arguments.get("backend")
                backend, note = override_backend(asked, override,
                                                 nccl_why_not=nccl_why_not(torch))
                if note:
                    bound.arguments["backend"] = backend
                alone = solo_world(bound.arguments, os.environ)
                if alone:
                    os.environ.update(alone)
                    note = "; ".join(filter(None, [note, SOLO_NOTE]))
                result = init_pg(*bound.args, **bound.kwargs)
                meter.group_started = True
                meter.send(protocol.SEEN, what="distributed",
                           requested={"backend": str(torch.distributed.get_backend()),
                                      "asked": None if asked is None else str(asked)},
                           applied={"world_size": torch.distributed.get_world_size(),
                                    "rank": torch.distributed.get_rank()}, note=note)
                return result

            torch.distributed.init_process_group = init_process_group
