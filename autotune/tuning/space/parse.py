"""Command-line input for the space: ``--space``, ``--fix``, ``--budget``. Pure.

Every error is a one-line `UsageError` that names the bad token.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from autotune.launching import script_flags
from autotune import UsageError
from autotune.tuning.space.knobs import (ALIASES, GPU_THREAD_PCT, KNOBS, ORDER, geometric, linear,
                                         pct_for_threads, threads_per_rank)

@dataclass(frozen=True)
class Range:
    """``NAME=LOW:HIGH`` or ``NAME=A,B,C`` as typed, before the machine is known."""

    name: str  # canonical knob name
    alias: str  # as typed ("threads" or the knob name)
    low: int | None = None
    high: int | None = None
    values: tuple[int, ...] = ()
    token: str = ""


_TOKEN = re.compile(r"^([A-Za-z_]+)=(.+)$")


def _split_tokens(tokens: Iterable[str]) -> list[str]:
    return [t for token in tokens for t in token.split()]


def _knob_name(name: str, flag: str, token: str) -> str:
    canonical = ALIASES.get(name, name)
    if canonical not in KNOBS:
        known = ", ".join([*ORDER, *ALIASES])
        raise UsageError(f"{flag}: unknown knob {name!r} in {token!r}; knobs: {known}")
    return canonical


def _int(text: str, flag: str, token: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"{flag}: {text!r} in {token!r} is not a whole number") from None


_SWITCHES = ("persistent", "pin_memory", "pin")  # 0 (off) or 1 (on)
_ZERO_OK = ("workers", "host_threads")  # 0: none (workers), torchrun's rule (host_threads)


def _check_value(name: str, alias: str, value: int, flag: str, token: str) -> None:
    least = 0 if name in _ZERO_OK or name in _SWITCHES else 1
    if value < least:
        raise UsageError(f"{flag}: {alias} must be >= {least}, but got {value} in {token!r}")
    if name in _SWITCHES and value > 1:
        raise UsageError(f"{flag}: {alias} is 0 (off) or 1 (on), but got {value} in {token!r}")
    if name == "thread_pct" and alias == "thread_pct" and value > 100:
        raise UsageError(f"{flag}: thread_pct must be <= 100, but got {value} in {token!r}")


def parse_space(tokens: Iterable[str], *, flag: str = "--space") -> dict[str, Range]:
    """``batch_size=16:512 workers=0:4 threads=1,2`` -> ranges by knob; one-line UsageErrors."""
    out: dict[str, Range] = {}
    for token in _split_tokens(tokens):
        m = _TOKEN.match(token)
        if not m:
            raise UsageError(f"{flag}: {token!r} is not NAME=LOW:HIGH or NAME=A,B,C (end the "
                             f"list with '--' before the script if it swallowed it)")
        alias, text = m.group(1), m.group(2)
        name = _knob_name(alias, flag, token)
        if name in out:
            raise UsageError(f"{flag}: {name} given twice ({out[name].token!r}, {token!r})")
        if ":" in text:
            lo_s, _, hi_s = text.partition(":")
            lo, hi = _int(lo_s, flag, token), _int(hi_s, flag, token)
            if lo > hi:
                raise UsageError(f"{flag}: `low <= high` must hold, but got {lo} > {hi} "
                                 f"in {token!r}")
            for v in (lo, hi):
                _check_value(name, alias, v, flag, token)
            out[name] = Range(name, alias, low=lo, high=hi, token=token)
        else:
            values = tuple(sorted({_int(v, flag, token) for v in text.split(",") if v}))
            if not values:
                raise UsageError(f"{flag}: no values in {token!r}")
            for v in values:
                _check_value(name, alias, v, flag, token)
            out[name] = Range(name, alias, values=values, token=token)
    return out


def parse_fix(tokens: Iterable[str], *, flag: str = "--fix") -> dict[str, Range]:
    """``workers=2 threads=1`` -> one value per knob."""
    tokens = _split_tokens(tokens)
    for token in tokens:
        m = _TOKEN.match(token)
        if not m or "," in m.group(2) or ":" in m.group(2):
            raise UsageError(f"{flag}: {token!r} is not NAME=VALUE")
    return parse_space(tokens, flag=flag)


def parse_values(tokens: Iterable[str], *, flag: str = "--baseline") -> dict[str, int]:
    """``batch_size=64 threads=4`` -> one value per knob, named as typed (as placeholders are)."""
    return {r.alias: r.values[0] for r in parse_fix(tokens, flag=flag).values()}


_DURATION = re.compile(r"(\d+(?:\.\d+)?)([hms]?)")


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``10m``, ``1h30m`` -> seconds (> 0)."""
    s = text.strip().lower()
    pos, total = 0, 0.0
    for m in _DURATION.finditer(s):
        if m.start() != pos or (not m.group(2) and (m.start() or m.end() != len(s))):
            break
        total += float(m.group(1)) * {"h": 3600, "m": 60, "s": 1, "": 1}[m.group(2)]
        pos = m.end()
    if pos != len(s) or not s or total <= 0:
        raise UsageError(f"--budget: expected a duration like 90s, 10m or 1h30m, got {text!r}")
    return total


def expand(r: Range, cores: int, device: str = "cpu") -> tuple[int, ...]:
    """Candidates of a user range, in the knob's own unit (threads become shares).

    On GPUs ``thread_pct`` is each rank's MPS share, not a share of the cores: a range keeps its
    ends and the `GPU_THREAD_PCT` steps between, and a thread count cannot stand for it.
    """
    if r.name == "thread_pct" and device == "gpu":
        if r.alias == "threads":
            raise UsageError(f"{r.token!r}: on GPUs thread_pct is each rank's MPS share "
                             f"(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), not a thread count; give "
                             f"thread_pct=25:100 or thread_pct=50 instead")
        if r.values:
            return r.values
        return tuple(sorted({r.low, r.high} | {v for v in GPU_THREAD_PCT if r.low < v < r.high}))
    if r.name == "thread_pct":
        if r.alias == "threads":
            threads = r.values or linear(r.low, r.high)
        elif r.values:
            return r.values
        else:
            threads = geometric(threads_per_rank(r.low, cores), threads_per_rank(r.high, cores))
        return tuple(sorted({pct_for_threads(min(t, cores), cores) for t in threads}))
    if r.values:
        return r.values
    if KNOBS[r.name].scale == "linear":
        return linear(r.low, r.high)
    return geometric(r.low, r.high)


def explicit_fixes(args: Sequence[str], ranges: Mapping[str, Range],
                   fixed: Mapping[str, Range], *, global_batch: int | None = None) \
        -> tuple[dict[str, Range], list[str]]:
    """Knobs the user set with an explicit flag in the script's args stay at that value.

    autotune never overrides an explicit flag (`autotune.launching.script_flags`): such a knob is fixed and the
    user is told how to hand it over (a placeholder). Asking to search it is a usage error.
    """
    out = dict(fixed)
    notes = []
    for knob, e in script_flags.explicit_knobs(args).items():
        if knob in ranges or knob in fixed or (knob == "batch_size" and global_batch):
            flag = "--global-batch" if knob not in ranges and knob not in fixed else \
                "--space" if knob in ranges else "--fix"
            raise UsageError(f"{flag} asks for {knob}, but the script's arguments set it "
                             f"explicitly ('{e.typed}'); write '{e.suggestion}' there instead")
        if e.number is None:
            continue
        out[knob] = Range(knob, knob, values=(e.number,), token=e.typed)
        notes.append(e.note())
    return out, notes
