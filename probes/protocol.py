"""The contract between the controller (`autotune/`) and the training processes (`probes/`).

Both sides import this module and nothing else of each other. It holds:

* the environment variables the controller sets before a training process starts (the child
  reads only its environment, never the controller's files);
* the message schema of the measurement channel: JSON objects, one per line, over TCP.

Channel, in order:

1. The rank connects to ``AUTOTUNE_ADDR``; the controller's first line is a ``challenge`` with a
   fresh random nonce, and the rank answers ``hello`` with its rank and pid and the proof that it
   holds ``AUTOTUNE_TOKEN``: HMAC-SHA256(token, nonce) (`proof`). The controller closes any
   connection whose first line is not a hello with the right proof, so no other user can inject
   measurements: the token lives only in the env of our own processes, which ``/proc`` keeps
   private to their owner, and never crosses the network (ranks on other hosts reach the
   controller over it), so seeing one conversation does not help to open another. A hello whose
   ``version`` is not `VERSION` (a rank of another autotune install) is refused, saying so.
2. The rank sends ``tick`` messages with *cumulative* counters every ``AUTOTUNE_TICK_S``. A lost
   or late tick loses nothing: the next one carries the totals. A new tick field (the step
   parts, the gradient norms) keeps `VERSION`: the reader takes a field that is absent as not
   measured, and a meter of this version always sends what it measured.
3. ``seen`` reports what the script asked for (its own batch size, worker count...) and what the
   interception applied; ``error`` reports an uncaught exception (``oom`` flagged); ``bye`` is sent
   when the script ends, with its exit code.
4. The controller may send ``stop``: the rank leaves at its next batch boundary with exit code 0,
   so collectives and CUDA contexts are torn down by the script's own unwinding, not a kill.

A rank that dies simply closes its socket; the controller notices the EOF and the process exit.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import json

VERSION = 2

# --- environment: controller -> training process -------------------------------------------
ENV_ADDR = "AUTOTUNE_ADDR"  # "host:port" of the controller's collector
ENV_TOKEN = "AUTOTUNE_TOKEN"  # per-run secret, hex
# "host:pid" of the process that holds the collector: a rank on that host that cannot reach the
# collector because that process has ended leaves, instead of running on with nobody to stop it
ENV_CONTROLLER = "AUTOTUNE_CONTROLLER"
ENV_TRIAL = "AUTOTUNE_TRIAL"  # trial id; also marks every process of the trial for clean-up
ENV_MODE = "AUTOTUNE_MODE"  # a `Mode` value: "full" | "synthetic" | "io"
ENV_TICK_S = "AUTOTUNE_TICK_S"  # seconds between ticks
ENV_BATCH_SIZE = "AUTOTUNE_BATCH_SIZE"  # per-rank DataLoader batch size to apply
ENV_WORKERS = "AUTOTUNE_WORKERS"  # DataLoader num_workers to apply
ENV_THREADS = "AUTOTUNE_THREADS"  # torch intra-op threads to apply
ENV_BUCKET_MB = "AUTOTUNE_BUCKET_MB"  # DDP bucket_cap_mb to apply
ENV_PREFETCH = "AUTOTUNE_PREFETCH"  # DataLoader prefetch_factor to apply (workers > 0 only)
ENV_PERSISTENT = "AUTOTUNE_PERSISTENT"  # DataLoader persistent_workers, 0 or 1 (workers > 0)
ENV_PIN_MEMORY = "AUTOTUNE_PIN_MEMORY"  # DataLoader pin_memory, 0 or 1
ENV_SYNTHETIC_BATCHES = "AUTOTUNE_SYNTHETIC_BATCHES"  # batches cached for synthetic replay

# Placement (set by autotune.launching.placement / autotune.launching.group, applied by probes.ranks_env at start-up)
ENV_PLACEMENT = "AUTOTUNE_PLACEMENT"  # JSON list, by host-local rank, of env entries to apply
ENV_LAUNCHER = "AUTOTUNE_LAUNCHER"  # "local" | "mpirun" | "srun": where rank identity comes from
ENV_LOCAL_WORLD_SIZE = "AUTOTUNE_LOCAL_WORLD_SIZE"  # ranks per host, for launchers that omit it
ENV_HOST_LOCAL_RANK = "AUTOTUNE_HOST_LOCAL_RANK"  # position on the host (LOCAL_RANK may be 0)
# the pid of the first metered process of a rank: a metered process that finds another pid
# here was started by the script (a subprocess of a rank), not by autotune
ENV_METERED_PID = "AUTOTUNE_METERED_PID"
ENV_CPUS = "AUTOTUNE_CPUS"  # "0,2-3": cores to pin this rank to (read by `parse_cpus`)
ENV_BACKEND_OVERRIDE = "AUTOTUNE_BACKEND_OVERRIDE"  # e.g. "gloo": replaces an NCCL request
# "host": the step clock (probes.parts) records no CUDA events, and times the parts on the host
# (set by the user, or by the GPU proof kit to tell the events' cost apart); else CUDA events
ENV_STEP_CLOCK = "AUTOTUNE_STEP_CLOCK"

# The user's tree (probes.writes): writes under these are reported, except in the scratch dir
ENV_WATCH_DIRS = "AUTOTUNE_WATCH_DIRS"  # os.pathsep-separated absolute directories
ENV_SCRATCH_DIR = "AUTOTUNE_SCRATCH_DIR"  # the probe's own working directory when isolated
# "1": a DDP model whose script registers no communication hook keeps DDP's own (C++) allreduce,
# untimed, instead of the timed Python dispatcher (the full run: the probes measured the parts,
# and routing every bucket through Python cost a 2-rank CPU run of 3 ms steps some 5%)
ENV_LEAVE_DDP_ALLREDUCE = "AUTOTUNE_LEAVE_DDP_ALLREDUCE"
# "1": a DDP rank of a world of two or more takes the gradient norms of the noise scale
# (probes.noise) in its communication hook; else it takes none: only a goodput tune and
# `autotune probe` use them, and at two CPU ranks of 2 ms steps they cost about 3% even sampled
ENV_NOISE = "AUTOTUNE_NOISE"



class Mode(str, enum.Enum):
    """What a probe runs (AccDP's analysis): the script as is; its first batches replayed with
    no input pipeline (the compute ceiling); or its loader drained with no training (the input
    ceiling). The value is what ``AUTOTUNE_MODE`` carries."""

    FULL = "full"
    SYNTHETIC = "synthetic"
    IO = "io"

    def __str__(self) -> str:  # the value, in f-strings and environment variables alike
        return self.value


MODES = tuple(m.value for m in Mode)
DEFAULT_TICK_S = 0.25
DEFAULT_SYNTHETIC_BATCHES = 8

# Knob name -> environment variable. The controller only sets the knobs it applies.
KNOB_ENV = {
    "batch_size": ENV_BATCH_SIZE,
    "workers": ENV_WORKERS,
    "threads": ENV_THREADS,
    "bucket_mb": ENV_BUCKET_MB,
    "prefetch": ENV_PREFETCH,
    "persistent": ENV_PERSISTENT,
    "pin_memory": ENV_PIN_MEMORY,
}

# --- messages ---------------------------------------------------------------------------------
CHALLENGE = "challenge"  # controller -> rank, its first line: {nonce}
HELLO = "hello"  # {proof, version, rank, local_rank, world_size, pid, host, sub}
# sub: true for a training process the script started itself (forked, spawned); its rank,
#      local_rank and world_size are the environment's, inherited from the process autotune
#      started, so several connections may carry the same rank
TICK = "tick"  # its fields, written by probes.meter and read by the controller, are TICK_*:
TICK_T = "t"  # when the tick was sent; every time is the rank's time.monotonic()
TICK_SAMPLES = "samples"  # cumulative: samples of training batches (autograd on)
TICK_BATCHES = "batches"  # training batches
TICK_EVAL_SAMPLES = "eval_samples"  # samples fetched with autograd off (evaluation)
TICK_STEPS = "steps"  # optimizer steps
TICK_BACKWARDS = "backwards"  # backward passes (the steps of a script without an optimizer)
TICK_RSS_PEAK_BYTES = "rss_peak_bytes"
TICK_CUDA_PEAK_BYTES = "cuda_peak_bytes"
TICK_LAST_BATCH_T = "last_batch_t"  # the latest training batch (0: none yet)
TICK_LAST_STEP_T = "last_step_t"
TICK_FIRST_BATCH_T = "first_batch_t"  # the first training batch since the previous tick (0: none)
TICK_FIRST_STEP_T = "first_step_t"
TICK_PARTS = "parts"  # {part: cumulative host seconds} for each of PARTS (probes.parts)
PARTS = ("data", "forward", "backward", "comm", "optimizer")
TICK_PARTS_CLOCK = "parts_clock"  # "host", or "cuda-events": the device's time between events
# Gradient norms for the noise scale (probes.noise), sent once a DDP rank of a world of more
# than one has synchronised a backward pass; cumulative over the steps counted: {local_sq: sum
# of |g_local|^2 (the rank's own gradient, before the allreduce), avg_sq: sum of |g_avg|^2 (the
# gradient the allreduce returned, the ranks' mean), steps, samples: the samples those local
# gradients were taken over, skipped: synchronised backward passes that were not one batch's
# gradient (accumulation with an allreduce each time)}. Absent: not measured.
TICK_NOISE = "noise"
NOISE_FIELDS = ("local_sq", "avg_sq", "steps", "samples", "skipped")
SEEN = "seen"  # {what, requested, applied, note}; what="writes": {paths: [{path, op, existed}]}
# what="distributed": requested {backend, asked}, applied {world_size, rank} (torch's, once
#      init_process_group returned)
# what=SEEN_STARTED_BY_SCRIPT: this process trains and was started by the script itself, not by
#      autotune: requested {start_method: "spawn"|"forkserver"|"fork", target: "module.qualname"
#      or null}, applied {}. The script starts its own ranks (torch.multiprocessing.spawn, say);
#      start_method "subprocess": a new interpreter a metered process started (Lightning's
#      launcher runs the script again for each further rank).
SEEN_STARTED_BY_SCRIPT = "started_by_script"
ERROR = "error"  # {kind: "oom"|"exception"|ERROR_STOP_ITERATION, exc_type, message}
# kind of an uncaught StopIteration (or the RuntimeError a generator makes of one): the script's
# data ran out, the way a ``while True: next(it)`` loop over a finite loader ends
ERROR_STOP_ITERATION = "stop_iteration"


class ErrorKind(str, enum.Enum):
    """An `ERROR` message's ``kind``, as the controller reads it."""

    OOM = "oom"
    EXCEPTION = "exception"
    STOP_ITERATION = ERROR_STOP_ITERATION

    def __str__(self) -> str:
        return self.value


BYE = "bye"  # {exit_code, stopped}
STOP = "stop"  # controller -> rank: {reason}

MAX_LINE_BYTES = 64 * 1024


def proof(token: str, nonce: str) -> str:
    """What a rank sends to show it holds the run's token, without sending the token."""
    return hmac.new(token.encode(), nonce.encode(), hashlib.sha256).hexdigest()


def parse_cpus(text: str) -> set[int]:
    """A CPU list as ``AUTOTUNE_CPUS`` and Linux's sysfs write it: ``"0,2-3"`` -> {0, 2, 3}."""
    cpus: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def encode(kind: str, /, **fields) -> bytes:
    """One message as a JSON line."""
    fields["type"] = kind
    return (json.dumps(fields, separators=(",", ":")) + "\n").encode()


def decode(line: bytes) -> dict:
    """Parse one line; raises ValueError on anything that is not a JSON object with a type."""
    if len(line) > MAX_LINE_BYTES:
        raise ValueError(f"message longer than {MAX_LINE_BYTES} bytes")
    msg = json.loads(line)
    if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
        raise ValueError("message must be a JSON object with a string 'type'")
    return msg
