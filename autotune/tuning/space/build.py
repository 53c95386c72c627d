"""The space itself: searched knobs with their candidates, fixed knobs, the baseline config.

Pure. `build` joins the machine, what the baseline probe saw and what the user asked for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from autotune import Note, UsageError
from autotune.tuning.space.knobs import (ALIASES, DESIGN_RULES, DOMAIN_RULES, KNOBS, ORDER,
                                         WITH_WORKERS,
                                         Baseline, Machine, pct_for_threads, threads_per_rank)
from autotune.tuning.space.parse import Range, expand

# Knobs that only CUDA MPS can move on a GPU, and their value without it (one rank, whole GPU).
# Knobs whose first moves are the baseline's neighbours on both sides, not the far end.
NEIGHBOURED = ("batch_size",)

_MPS_KNOBS = {"instances": (1, "ranks sharing a GPU need CUDA MPS"),
              "thread_pct": (100, "a GPU share below 100% is set through CUDA MPS")}

@dataclass(frozen=True)
class Space:
    """Searched knobs with their candidates, fixed knobs, and the baseline as a config."""

    domains: Mapping[str, tuple[int, ...]]
    fixed: Mapping[str, int]
    baseline: Mapping[str, int]
    cores: int
    global_batch: int | None = None
    notes: tuple[Note, ...] = ()  # why a knob is not searched, or narrowed: hints
    placeholders: tuple[str, ...] = ()
    device: str = "cpu"
    devices: int = 1  # what the full run spreads ranks over: GPUs x hosts (hosts on CPU)
    own_ranks: bool = False  # the script starts its own data-parallel ranks
    own_world: int = 0  # ...and how many (torch's world size in the baseline; 0: none)
    # why the space holds ``instances`` at 1 ("": searched, or the user's own choice)
    ranks_why: str = ""

    @property
    def world_devices(self) -> int:
        """What one instance's batch is multiplied by to make the job's: the devices the full
        run spreads ranks over, or the ranks the script starts itself when more (Lightning's
        ``Trainer(devices=2, strategy="ddp")`` on one CPU host: 2)."""
        return max(self.devices, self.own_world)

    def job_batch(self, cfg: Mapping[str, int]) -> int | None:
        """The job's global batch under ``cfg`` (`global_batch` over `world_devices`)."""
        return global_batch(cfg, self.world_devices)

    def keeps_batch(self, cfg: Mapping[str, int]) -> bool:
        """Whether ``cfg`` trains with the script's own global batch (always, under
        ``--global-batch``; a batch autotune cannot see counts as kept)."""
        return bool(self.global_batch) or self.job_batch(cfg) == self.job_batch(self.baseline)

    def batch_note(self, cfg: Mapping[str, int]) -> str:
        """`batch_change_note` of ``cfg`` against the baseline, ranks the script starts itself
        counted ("" under ``--global-batch``)."""
        if self.global_batch:
            return ""
        return batch_change_note(self.baseline, cfg, self.devices, own_world=self.own_world)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n in ORDER if n in self.domains)

    def config(self, choice: Mapping[str, int]) -> dict[str, int]:
        """A full, canonical config from values of the searched knobs."""
        cfg = {n: int(self.fixed[n]) for n in ORDER if n in self.fixed}
        for n in self.names:  # a knob the choice lacks (bucket_mb on one rank) keeps its default
            cfg[n] = int(choice.get(n, self.baseline.get(n, KNOBS[n].conventional)))
        return self.canonical(cfg)

    def canonical(self, cfg: Mapping[str, int]) -> dict[str, int]:
        return canonical(cfg, self.global_batch, self.devices, own_ranks=self.own_ranks)

    def key(self, cfg: Mapping[str, int]) -> tuple:
        return tuple(sorted(self.canonical(cfg).items()))

    def index(self, name: str, value: int) -> int:
        """Position of ``value`` among the candidates of ``name``; the nearest when absent."""
        values = self.domains[name]
        return min(range(len(values)), key=lambda i: (abs(values[i] - value), i))

    def choice_from_config(self, cfg: Mapping[str, int]) -> dict[str, int]:
        """The searched knobs' positions for a config (nearest candidate where needed)."""
        base = {**self.baseline, **cfg}
        return {n: self.index(n, int(base[n])) for n in self.names if n in base}

    def one_at_a_time(self, first: Sequence[str] = ()) -> list[dict[str, int]]:
        """The baseline with one knob moved: the first configs worth measuring, the knobs in
        ``first`` first (those that move what binds the baseline). A knob moves to its far end,
        except the per-rank batch, which moves to its neighbours on both sides
        (`NEIGHBOURED`), the larger first: a script's batch is seldom far from a good one, and
        one that runs faster per sample at a smaller size is found only by looking there;
        `Space.batch_walk` goes on in the direction that paid off. The larger comes first
        because a larger batch that pays says where the walk goes, and the search then holds
        the smaller back (`autotune.tuning.queue_policy.release_smaller`).

        With a handful of noisy probes, learning each knob's direction first beats random
        starting points; `autotune.tuning.search_rules.combine` then joins the moves that paid off.

        On a GPU whose one rank may be joined by others (``instances`` searched), the rank count
        moves before the share, and the lone rank's share does not move at all: a share below
        100% only takes streaming multiprocessors from a rank that has the GPU to itself, and
        the share matters once ranks share it (`initial_design`'s two clients at half, then the
        search). On an H200 a 2-minute budget spent one of its three probes on that move.
        """
        out = []
        names = list(self.names)
        if self._ranks_may_share_the_gpu():  # the rank count takes the share's place
            first = list(dict.fromkeys("instances" if n == "thread_pct" else n for n in first))
            names = [n for n in names if n != "thread_pct"]
        order = [n for n in first if n in names] + [n for n in names if n not in first]
        for n in order:
            values = self.domains[n]
            i = self.index(n, self.baseline.get(n, values[0]))
            if n in NEIGHBOURED:
                targets = [values[j] for j in (i + 1, i - 1) if 0 <= j < len(values)]
            else:
                targets = [values[-1] if i < (len(values) - 1) / 2 else values[0]]
            for v in targets:
                cfg = self.config({**self.baseline, n: v})
                if self.key(cfg) != self.key(self.baseline) and cfg not in out:
                    out.append(cfg)
        return out

    def _ranks_may_share_the_gpu(self) -> bool:
        """A GPU space whose baseline is one rank per GPU and whose rank count is searched."""
        return (self.device == "gpu" and self.baseline.get("instances", 1) == 1
                and len(self.domains.get("instances", ())) > 1)

    def batch_walk(self, line: Mapping[int, float | None], *, min_gain_rel: float,
                   rates: bool = False,
                   blocked: Callable[[int], bool] | None = None) -> dict[str, int] | None:
        """The next per-rank batch worth measuring along the baseline's line (every other knob
        the baseline's), out from the best batch measured in the direction it lies from the
        script's own, while that best beats the script's batch by more than ``min_gain_rel``.
        ``line``: batch -> score (None: failed, or out of memory). None when there is no such
        step: nothing beat the script's batch, the next one is measured already, it failed,
        or the domain ends there.

        One step, unless ``rates`` (the scores are samples/s) and the step-time model
        (`jump_along`) fitted to the line says the gain goes on past it: then the nearest batch
        beyond which the model sees no more than ``min_gain_rel``. minGPT's shape gained 33%
        from 32 to 64 and its grid's best was 256, three steps away at ~1 min a probe; the model
        from 32 and 64 put 256 within 1% of what the grid measured. ``blocked``: a batch a
        jump may not land on (at or above one that ran out of memory, a probe the budget left
        cannot hold); a jump stops short of the first, and one step is taken whatever it says
        (the search decides whether that step's probe fits)."""
        if "batch_size" not in self.domains or "batch_size" not in self.baseline:
            return None
        values = self.domains["batch_size"]
        start = self.index("batch_size", self.baseline["batch_size"])
        base = line.get(values[start])
        scored = {b: v for b, v in line.items() if v is not None}
        if not base or not scored:
            return None
        best = max(scored, key=lambda b: scored[b])
        if best == values[start] or scored[best] <= base * (1 + min_gain_rel):
            return None
        i = self.index("batch_size", best)
        step = 1 if i > start else -1
        if not 0 <= i + step < len(values) or values[i + step] in line:
            return None
        ahead = []  # the batches past the best, up to the first measured or ruled out
        for j in range(i + step, len(values) if step > 0 else -1, step):
            if values[j] in line or (blocked is not None and blocked(values[j])):
                break
            ahead.append(values[j])
        target = values[i + step]
        if rates and len(ahead) > 1:
            side = {b: v for b, v in scored.items()
                    if (b - values[start]) * step >= 0 and v > 0}
            target = jump_along(side, ahead, min_gain_rel) or target
        return self.config({**self.baseline, "batch_size": target})

    def batch_far(self, line: Mapping[int, float | None], *, min_gain_rel: float,
                  blocked: Callable[[int], bool] | None = None) -> dict[str, int] | None:
        """One larger batch to look at when the walk has nowhere to go (`batch_walk` gave
        None) and the line reads flat: the script's larger neighbour no more than twice
        ``min_gain_rel`` below the best batch measured along it. A gain that grows with the
        batch hides in the noise one step out: nanoGPT's shape reads +9% at 16 against its 12
        and +15-18% at 32-96, and on a machine whose processes differ by 7-25% a tune read 8
        at +5.5% and 16 level. The batch halfway, on the domain's log scale, between that
        neighbour and the largest a probe may take (``blocked``: as in `batch_walk`); if it
        pays, the walk goes on from it. Once per line: None when a batch past the neighbour is
        measured already, or a neighbour is not yet. A line whose smaller batches clearly paid
        (word_language_model's 10 at +20% against its 20) is not flat: no look."""
        if "batch_size" not in self.domains or "batch_size" not in self.baseline:
            return None
        values = self.domains["batch_size"]
        start = self.index("batch_size", self.baseline["batch_size"])
        base, up = line.get(values[start]), start + 1
        if not base or up >= len(values):
            return None
        if any(values[j] not in line for j in (start - 1, up) if 0 <= j < len(values)):
            return None
        beside = line[values[up]]
        best = max(v for v in line.values() if v is not None)
        if beside is None or beside < best * (1 - 2 * min_gain_rel):
            return None
        if any(b in line for b in values[up + 1:]):
            return None
        ahead = []
        for b in values[up + 1:]:
            if blocked is not None and blocked(b):
                break
            ahead.append(b)
        if not ahead:
            return None
        return self.config({**self.baseline, "batch_size": ahead[(len(ahead) - 1) // 2]})

    def initial_design(self, first: Sequence[str] = ()) -> list[dict[str, int]]:
        """What to measure right after the baseline: `one_at_a_time` (``first`` first), then
        the device's informed starting points (`DESIGN_RULES`: on CPU, workers and threads
        sharing the cores)."""
        out = self.one_at_a_time(first)
        rule = DESIGN_RULES.get(self.device)
        for change in (rule(self.domains, self.baseline, self.cores) if rule else []):
            cfg = self.config({**self.baseline, **change})
            if self.key(cfg) != self.key(self.baseline) and \
                    all(self.key(cfg) != self.key(o) for o in out):
                out.append(cfg)
        return out

    def configs(self) -> list[dict[str, int]]:
        """Every distinct config of the space, canonical."""
        out: dict[tuple, dict[str, int]] = {}
        for pos in _product([range(len(self.domains[n])) for n in self.names]):
            cfg = self.config({n: self.domains[n][i] for n, i in zip(self.names, pos)})
            out.setdefault(self.key(cfg), cfg)
        return list(out.values())

    def size(self) -> int:
        """How many distinct configs the space holds."""
        return len(self.configs())

    def trial_knobs(self, cfg: Mapping[str, int]) -> tuple[dict[str, float], int]:
        """What a probe gets for ``cfg``: `rank_knobs` on this space's host and job."""
        return rank_knobs(cfg, cores=self.cores, device=self.device,
                          global_batch=self.global_batch, devices=self.devices,
                          own_ranks=self.own_ranks)

    def to_dict(self) -> dict:
        return {"domains": {n: list(v) for n, v in self.domains.items()},
                "fixed": dict(self.fixed), "baseline": dict(self.baseline), "cores": self.cores,
                "global_batch": self.global_batch, "notes": [n.text for n in self.notes],
                "placeholders": list(self.placeholders), "device": self.device,
                "devices": self.devices, "own_ranks": self.own_ranks,
                "own_world": self.own_world, "ranks_why": self.ranks_why}

    @classmethod
    def from_dict(cls, d: Mapping) -> Space:
        return cls(domains={n: tuple(v) for n, v in d["domains"].items()},
                   fixed=dict(d["fixed"]), baseline=dict(d["baseline"]), cores=int(d["cores"]),
                   global_batch=d.get("global_batch"),
                   notes=tuple(Note.hint(n) for n in d.get("notes", ())),
                   placeholders=tuple(d.get("placeholders", ())),
                   device=str(d.get("device", "cpu")), devices=int(d.get("devices", 1)),
                   own_ranks=bool(d.get("own_ranks", False)),
                   own_world=int(d.get("own_world") or 0), ranks_why=str(d.get("ranks_why", "")))


def job_devices(device: str, gpus: int, hosts: int) -> int:
    """What a job spreads its ranks over, and a global batch is divided by (times
    ``instances``): every GPU of every host on GPUs, the hosts on CPU."""
    return max(1, gpus if device == "gpu" else 1) * max(1, hosts)


def rank_knobs(cfg: Mapping[str, int], *, cores: int, device: str,
               global_batch: int | None = None, devices: int = 1,
               own_ranks: bool = False) -> tuple[dict[str, float], int]:
    """What the ranks of a probe or a run get for ``cfg``: their knobs, and ``instances``.

    The one translation, for the space's probes and a recipe's run. On CPU the share of cores
    becomes a thread count (`threads_per_rank`); on GPUs ``thread_pct`` stays, and
    `autotune.launching.placement` makes it each rank's MPS share.
    """
    c = canonical(cfg, global_batch, devices, own_ranks=own_ranks)
    knobs: dict[str, float] = {}
    for name, value in c.items():
        if name == "thread_pct" and device != "gpu":
            knobs["threads"] = threads_per_rank(value, cores)
        elif name == "host_threads":  # a GPU rank's threads; 0 (and on CPU): the rule's
            if value and device == "gpu":
                knobs["threads"] = value
        else:
            knobs[name] = value
    return knobs, c.get("instances", 1)


def jump_along(rates: Mapping[int, float], ahead: Sequence[int],
               min_gain_rel: float) -> int | None:
    """Where a batch walk should land among ``ahead`` (the unmeasured batches past the best, in
    walking order), from the step-time model fitted to ``rates`` (batch -> samples/s on the
    walk's side of the script's batch, its own included): a step costs a fixed part plus a
    part per sample, t(b) = a + c*b, fitted by least squares to t = b / rate. The nearest
    batch whose predicted rate is within ``min_gain_rel`` of the best predicted among
    ``ahead``. None when the model says nothing the line does not: fewer than two points, or
    no fixed part (a <= 0: the per-sample cost falls as the batch shrinks, which a fixed part
    cannot explain; caches can, and only a measurement tells)."""
    if len(rates) < 2 or not ahead:
        return None
    bs = sorted(rates)
    ts = [b / rates[b] for b in bs]
    mean_b, mean_t = sum(bs) / len(bs), sum(ts) / len(ts)
    var = sum((b - mean_b) ** 2 for b in bs)
    if var <= 0:
        return None
    c = sum((b - mean_b) * (t - mean_t) for b, t in zip(bs, ts)) / var
    a = mean_t - c * mean_b
    if a <= 0:
        return None

    def rate(b: int) -> float:
        return b / (a + c * b) if a + c * b > 0 else float("inf")

    best = max(rate(b) for b in ahead)
    for b in ahead:
        if rate(b) * (1 + min_gain_rel) >= best:
            return b
    return None


def canonical(cfg: Mapping[str, int], global_batch: int | None = None,
              devices: int = 1, *, own_ranks: bool = False) -> dict[str, int]:
    """Derived knobs filled in (with a global batch, the per-rank batch for a world of
    ``instances x devices`` ranks); knobs without effect dropped (bucket_mb on one rank,
    prefetch and persistent without DataLoader workers, pin on one rank)."""
    out = {n: int(cfg[n]) for n in ORDER if n in cfg}
    instances = out.get("instances", 1)
    if global_batch:
        out["batch_size"] = global_batch // (instances * devices)
    if instances * devices <= 1 and not own_ranks:
        out.pop("bucket_mb", None)
        out.pop("pin", None)  # one rank: no other rank's cores to keep apart from
    if out.get("workers", 1) == 0:  # torch takes them only with workers
        for name in WITH_WORKERS:
            out.pop(name, None)
    return {n: out[n] for n in ORDER if n in out}


def global_batch(cfg: Mapping[str, int], devices: int = 1) -> int | None:
    """Samples in one step of the whole job: per-rank batch x ranks (instances x devices)."""
    if not cfg.get("batch_size"):
        return None
    return int(cfg["batch_size"]) * int(cfg.get("instances", 1)) * max(1, devices)


def batch_change_note(base_cfg: Mapping[str, int], best_cfg: Mapping[str, int],
                      devices: int = 1, *, own_world: int = 0) -> str:
    """What a winner that changes the job's global batch does to training, in one sentence
    ("" when it keeps the script's own). Throughput is not the whole story: the learning rate
    that fitted the script's batch no longer fits, and past the critical batch size a sample
    teaches less. ``own_world``: the ranks the script starts itself (Lightning's
    ``devices=2``), which multiply its batch as autotune's own ranks do."""
    per = max(1, devices, own_world)
    base, best = global_batch(base_cfg, per), global_batch(best_cfg, per)
    if not base or not best or base == best:
        return ""
    ratio = best / base
    ranks = int(best_cfg.get("instances", 1)) * per
    own = f", {own_world} started by the script itself" if own_world > max(1, devices) else ""
    how = f"batch_size {best_cfg['batch_size']} x {ranks} ranks{own}" if ranks > 1 else \
        f"batch_size {best_cfg['batch_size']}"
    return (f"the winner trains with a global batch of {best} ({how}), {ratio:.3g}x the "
            f"script's own {base}: a learning rate set for {base} usually needs scaling with "
            f"it ({ratio:.3g}x by the linear rule, with warm-up; {ratio ** 0.5:.3g}x by the "
            f"square-root rule, common with Adam), and past the critical batch size a sample "
            f"teaches less; to keep the script's batch, run the recipe with --keep-batch (the "
            f"fastest config measured that keeps it) or tune with --global-batch {base}")


def _product(ranges: Sequence[range]):
    if not ranges:
        yield ()
        return
    for i in ranges[0]:
        for rest in _product(ranges[1:]):
            yield (i, *rest)


@dataclass(frozen=True)
class SpaceRequest:
    """What the user asked for on the command line."""

    ranges: Mapping[str, Range] = field(default_factory=dict)
    fixed: Mapping[str, Range] = field(default_factory=dict)
    global_batch: int | None = None
    placeholders: tuple[str, ...] = ()
    devices: int = 1  # GPUs x hosts the full run spreads ranks over (hosts on CPU)


def check_request(req: SpaceRequest) -> None:
    """Conflicts visible before anything runs."""
    both = sorted(set(req.ranges) & set(req.fixed))
    if both:
        raise UsageError(f"{both[0]} is both in --space and in --fix; keep one")
    if req.global_batch is not None:
        if req.global_batch < 1:
            raise UsageError(f"--global-batch must be >= 1, but got {req.global_batch}")
        if "batch_size" in req.ranges or "batch_size" in req.fixed:
            raise UsageError("--global-batch sets the per-rank batch size (global / ranks); "
                             "drop batch_size from --space/--fix")


def build(machine: Machine, baseline: Baseline, req: SpaceRequest) -> Space:
    """The space for this script on this machine, with the user's ranges and fixes applied."""
    check_request(req)
    cores = machine.cores
    notes: list[str] = []
    ranks_why = ""
    base_cfg = _baseline_config(baseline, cores, req.placeholders, machine.device)
    domains: dict[str, tuple[int, ...]] = {}
    fixed: dict[str, int] = {}
    for name in ORDER:
        if name in req.fixed:
            fixed[name] = expand(req.fixed[name], cores, machine.device)[0]
            _check_mps(name, (fixed[name],), machine, "--fix")
            _check_fits(name, fixed[name], machine)
            continue
        if name in req.ranges:
            values = expand(req.ranges[name], cores, machine.device)
            _check_mps(name, values, machine, "--space")
        else:
            rule = DOMAIN_RULES.get((name, machine.device))
            values = rule(machine, _with_placeholders(baseline, base_cfg)) if rule else ()
        values, note, why = _applicable(name, values, baseline, base_cfg, req,
                                        name in req.ranges, machine)
        if note:
            notes.append(note)
        if name == "instances":
            ranks_why = why
        if len(values) == 1:
            fixed[name] = values[0]
        elif values:
            domains[name] = values
    if req.global_batch:
        domains, fixed = _keep_global_batch(domains, fixed, req.global_batch, req.devices)
        base_cfg["batch_size"] = req.global_batch // (base_cfg.get("instances", 1) * req.devices)
    can_multi = baseline.own_ranks or \
        max(domains.get("instances", (fixed.get("instances", 1),))) * req.devices > 1
    if max(domains.get("workers", (fixed.get("workers", base_cfg.get("workers", 0)),))) == 0:
        for name in WITH_WORKERS:  # no config has workers: nothing to prefetch or keep
            if domains.pop(name, None) is not None:
                notes.append(f"{name}: not tuned: no config has DataLoader workers")
            fixed.pop(name, None)
    if not can_multi:
        domains.pop("bucket_mb", None)
        fixed.pop("bucket_mb", None)
        if machine.device == "gpu" and "thread_pct" in domains and "thread_pct" not in req.ranges:
            del domains["thread_pct"]
            fixed["thread_pct"] = 100
            notes.append("thread_pct: fixed at 100: one rank per GPU gains nothing from a "
                         "smaller MPS share")
    for name in ORDER:  # the baseline config holds every knob the space has
        if name in domains or name in fixed:
            # a knob the baseline did not see, held at one value (an explicit flag of the
            # script's, `--batch_size=12` with no DataLoader to read): the script ran with it,
            # so the baseline has it too, and is the same config as a probe of it
            base_cfg.setdefault(name, fixed.get(name, KNOBS[name].conventional))
        else:
            base_cfg.pop(name, None)
    return Space(domains=domains, fixed=fixed,
                 baseline=canonical(base_cfg, req.global_batch, req.devices,
                                    own_ranks=baseline.own_ranks),
                 cores=cores, global_batch=req.global_batch,
                 notes=tuple(Note.hint(n) for n in notes),
                 placeholders=tuple(req.placeholders), device=machine.device,
                 devices=req.devices, own_ranks=baseline.own_ranks,
                 own_world=baseline.own_world if baseline.own_ranks else 0,
                 ranks_why=ranks_why)


def _baseline_config(b: Baseline, cores: int, placeholders: Sequence[str],
                     device: str) -> dict[str, int]:
    """The script as it ran: on GPUs one rank with the whole GPU (no MPS share)."""
    cfg: dict[str, int] = {"instances": 1}
    if b.batch_size is not None:
        cfg["batch_size"] = b.batch_size
    if b.workers is not None:
        cfg["workers"] = b.workers
    cfg["thread_pct"] = 100 if device == "gpu" else \
        pct_for_threads(min(b.threads or cores, cores), cores)
    if b.bucket_mb:
        cfg["bucket_mb"] = int(b.bucket_mb)
    for name in ("prefetch", "persistent", "pin_memory"):
        if getattr(b, name) is not None:
            cfg[name] = int(getattr(b, name))
    for name in placeholders:
        name = ALIASES.get(name, name)
        if name in KNOBS:
            cfg.setdefault(name, KNOBS[name].conventional)
    return cfg


def _with_placeholders(b: Baseline, cfg: Mapping[str, int]) -> Baseline:
    return dataclasses.replace(b, batch_size=cfg.get("batch_size", b.batch_size),
                               workers=cfg.get("workers", b.workers))


def _check_mps(name: str, values: Sequence[int], machine: Machine, flag: str) -> None:
    """Asking for what only MPS can do on a GPU host without MPS: a usage error, before any
    probe would fail to start it."""
    if machine.device != "gpu" or machine.mps or name not in _MPS_KNOBS:
        return
    alone, why = _MPS_KNOBS[name]
    if any(v != alone for v in values):
        raise UsageError(f"{flag} asks for {name} other than {alone}, but {why}, which is not "
                         f"available here: {machine.mps_why}")


def _applicable(name: str, values: tuple[int, ...], b: Baseline, base_cfg: Mapping[str, int],
                req: SpaceRequest, asked: bool, machine: Machine) \
        -> tuple[tuple[int, ...], str, str]:
    """Drop knobs the script or the host cannot take: the values left, a note that says why,
    and for a knob held at one value, the reason alone."""
    if name == "batch_size" and "batch_size" not in base_cfg and not req.global_batch:
        if asked:
            raise UsageError("cannot tune batch_size: the script builds no DataLoader with a "
                             "batch size; put {batch_size} in its arguments")
        return (), ("batch_size: not tuned: the script builds no DataLoader with a batch size "
                    "and has no {batch_size} placeholder in its arguments"), ""
    if name == "workers" and "workers" not in base_cfg:
        if asked:
            raise UsageError("cannot tune workers: the script builds no DataLoader; put "
                             "{workers} in its arguments")
        return (), "workers: not tuned: the script builds no DataLoader", ""
    if name in ("prefetch", "persistent", "pin_memory") and "workers" not in base_cfg:
        if asked:
            raise UsageError(f"cannot tune {name}: the script builds no DataLoader")
        return (), "", ""  # said once, of workers
    if machine.device == "gpu" and not machine.mps and name in _MPS_KNOBS and not asked:
        alone, why = _MPS_KNOBS[name]
        why = f"{why}, which is not available here: {machine.mps_why}"
        return (alone,), f"{name}: fixed at {alone}: {why}", why
    if name == "instances" and not b.distributed and not asked:
        why = b.alone_why or ("the baseline probe never saw the script initialise "
                              "torch.distributed, so extra ranks would each train alone")
        return (1,), f"instances: fixed at 1: {why}; --space instances=1:N tries anyway", why
    if name == "instances" and b.own_ranks and not asked:
        why = ("the script starts its own data-parallel ranks (torch.multiprocessing.spawn or "
               "the like), so each rank autotune added would start a whole job of its own")
        return (1,), f"instances: fixed at 1: {why}", why
    if name == "instances" and values == (1,) and machine.cores <= 1 and not asked:
        if machine.ranks_per_node is not None:  # --space instances=1:2 would not fit either
            why = _allocation_why(machine, 1)
            return (1,), f"instances: fixed at 1: {why}", why
        why = "this host has 1 core, which a second rank would only share"
        return (1,), f"instances: fixed at 1: {why}; --space instances=1:N tries anyway", why
    if name == "instances":
        return _fitting_allocation(values, machine, asked)
    return values, "", ""


def most_instances(machine: Machine) -> int | None:
    """The largest ``instances`` a node of the Slurm allocation can start (its ranks per node,
    over its GPUs on a GPU machine, where ``instances`` is ranks per GPU); None outside an
    allocation."""
    if machine.ranks_per_node is None:
        return None
    per = machine.gpus if machine.device == "gpu" and machine.gpus else 1
    return max(1, machine.ranks_per_node // per)


def _allocation_why(machine: Machine, most: int) -> str:
    per_gpu = " per GPU" if machine.device == "gpu" and machine.gpus else ""
    return (f"a node of the Slurm allocation starts at most {most} rank{'s' if most > 1 else ''}"
            f"{per_gpu} ({machine.ranks_per_node} per node: its CPUs per node, or "
            f"--ntasks-per-node when smaller), and srun refuses a step that asks for more")


def _fitting_allocation(values: tuple[int, ...], machine: Machine,
                        asked: bool) -> tuple[tuple[int, ...], str, str]:
    """``instances`` candidates a node of the allocation can start; the rest left out, said."""
    most = most_instances(machine)
    if most is None or all(v <= most for v in values):
        return values, "", ""
    kept = tuple(v for v in values if v <= most)
    left = ", ".join(str(v) for v in values if v > most)
    why = _allocation_why(machine, most)
    if not kept:
        raise UsageError(f"--space instances: none of {', '.join(map(str, values))} fits: "
                         f"{why}; allocate more CPUs per node (sbatch -c N or "
                         f"--ntasks-per-node N)")
    held = why if len(kept) == 1 else ""
    return kept, f"instances: {left} left out: {why}", held


def _check_fits(name: str, value: int, machine: Machine) -> None:
    """``--fix instances=N`` beyond what a node of the allocation can start: a usage error
    before any probe would fail to start."""
    most = most_instances(machine)
    if name == "instances" and most is not None and value > most:
        raise UsageError(f"--fix instances={value} does not fit: {_allocation_why(machine, most)}"
                         f"; fix {most} or fewer, or allocate more CPUs per node (sbatch -c N or "
                         f"--ntasks-per-node N)")


def _keep_global_batch(domains: dict, fixed: dict, n: int,
                       devices: int = 1) -> tuple[dict, dict]:
    """Only world sizes (instances x devices) that divide the global batch; batch_size follows
    from them."""
    domains.pop("batch_size", None)
    fixed.pop("batch_size", None)
    over = f" x {devices} devices" if devices > 1 else ""
    if "instances" in domains:
        ok = tuple(v for v in domains["instances"] if n % (v * devices) == 0)
        if not ok:
            raise UsageError(f"--global-batch {n}: no candidate world size divides it "
                             f"(instances {list(domains['instances'])}{over})")
        if len(ok) == 1:
            domains.pop("instances")
            fixed["instances"] = ok[0]
        else:
            domains["instances"] = ok
    elif n % (fixed.get("instances", 1) * devices):
        raise UsageError(f"--global-batch {n} is not divisible by the world size: instances="
                         f"{fixed.get('instances', 1)}{over}")
    return domains, fixed
