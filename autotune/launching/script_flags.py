"""Knob flags the user already wrote in the script's arguments, in any spelling. Pure.

Scripts expose the batch size and the worker count under many names: ``-b 32``, ``-j 4``,
``--batch-size 32``, ``--batch_size=32``, ``--batchSize 32``, ``--bs 32``, config overrides such as
``--trainer.batch_size=32`` or Hydra's ``data.num_workers=4``. `explicit_knobs` finds them.

The policy built on it: a knob the user set explicitly is never silently overridden. The explicit
value wins, the knob is fixed (neither intercepted nor searched), and the user is told so and how
to hand it to autotune instead: write the placeholder (``--batch-size {batch_size}``) in place of
the value. A flag whose value already holds a placeholder is not explicit: autotune fills it in.

Matching is by name: a flag is normalised (lower case, ``-``/``_`` removed, the last component
of a dotted key) and looked up in `LONG_NAMES`; single-letter names (``-b``, ``-j``) count only
as short options, never as keys (``--model.b=3`` is not a batch size). Like argparse, the last
occurrence wins; ``--`` ends the options.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Explicit", "LONG_NAMES", "RUN_NAMES", "SHORT_NAMES", "explicit_knobs", "run_length",
           "split_knobs"]

# Knob -> normalised long names that mean it. Only per-rank batch sizes: an eval, global or
# accumulated batch size is something else.
LONG_NAMES: dict[str, frozenset[str]] = {
    "batch_size": frozenset({
        "batchsize", "bs", "batch", "trainbatchsize", "perdevicetrainbatchsize",
        "pergputrainbatchsize", "batchsizepergpu", "batchsizeperdevice", "microbatchsize",
        "trainmicrobatchsizepergpu", "localbatchsize", "batchsizetrain",
    }),
    "workers": frozenset({
        "workers", "numworkers", "nworkers", "dataloaderworkers", "dataloadernumworkers",
        "loaderworkers", "dataworkers", "numdataworkers", "numloaderworkers", "workersnum",
    }),
}
SHORT_NAMES: dict[str, str] = {"b": "batch_size", "j": "workers"}  # -b 32, -j 4 (ImageNet example)
# How long the run is, as scripts spell it: epochs over the dataset, or optimizer steps.
RUN_NAMES: dict[str, frozenset[str]] = {
    "epochs": frozenset({"epochs", "epoch", "numepochs", "nepochs", "maxepochs",
                         "numtrainepochs", "trainepochs", "totalepochs"}),
    "steps": frozenset({"maxsteps", "maxiters", "maxiter", "maxiterations", "numsteps",
                        "totalsteps", "trainsteps", "numiters", "iters", "iterations",
                        "steps", "numtrainsteps", "maxtrainsteps"}),
}

_PLACEHOLDER = re.compile(r"\{[a-z_]+\}")
_NEGATIVE = re.compile(r"^-\d")
_KEY = re.compile(r"^\+{0,2}([A-Za-z_][\w.\-]*)=(.*)$", re.S)  # Hydra: key=v, +key=v, ++key=v


@dataclass(frozen=True)
class Explicit:
    """One knob the user set in the script's arguments."""

    knob: str  # "batch_size" | "workers"
    flag: str  # as typed: "--batch-size", "-b", "trainer.batch_size"
    value: str  # as typed: "32"
    sep: str  # between flag and value as typed: " " (two tokens), "=" or "" ("-b32")

    @property
    def number(self) -> int | None:
        """The value as a whole number, None when it is not one."""
        try:
            return int(self.value)
        except ValueError:
            return None

    @property
    def typed(self) -> str:
        """The flag and value as the user typed them."""
        return f"{self.flag}{self.sep}{self.value}"

    @property
    def suggestion(self) -> str:
        """The same flag with the placeholder in place of the value."""
        return f"{self.flag}{self.sep}{{{self.knob}}}"

    def note(self) -> str:
        """What to tell the user: which value wins, and how to tune the knob instead."""
        return (f"{self.knob} stays {self.value}: you passed '{self.typed}' explicitly and "
                f"autotune never overrides an explicit flag; to let autotune tune it, write "
                f"'{self.suggestion}' instead")


def _norm(name: str) -> str:
    return name.rsplit(".", 1)[-1].replace("-", "").replace("_", "").lower()


def _knob_of(name: str, *, short: bool, table: Mapping[str, frozenset[str]] = LONG_NAMES,
             shorts: Mapping[str, str] = SHORT_NAMES) -> str | None:
    if short:
        return shorts.get(name)
    key = _norm(name)
    if len(key) < 2:
        return None
    for knob, names in table.items():
        if key in names:
            return knob
    return None


def _is_value(token: str) -> bool:
    return not token.startswith("-") or bool(_NEGATIVE.match(token))


def _scan(args: Sequence[str], table: Mapping[str, frozenset[str]] = LONG_NAMES,
          shorts: Mapping[str, str] = SHORT_NAMES):
    """Yield (knob, flag, value, sep) for every flag of ``table`` (and ``shorts``), in order."""
    i = 0
    while i < len(args):
        token = args[i]
        if token == "--":
            return
        if token.startswith("-") and not _NEGATIVE.match(token) and len(token) > 1:
            body = token.lstrip("-")
            dashes = len(token) - len(body)
            name, sep, value = body.partition("=")
            if dashes == 1 and not sep and len(body) > 1 and body[0] in shorts \
                    and body[1:].isdigit():  # -b32: short option glued to its value
                name, sep, value = body[0], "", body[1:]
            knob = _knob_of(name, short=dashes == 1 and len(name) == 1, table=table,
                            shorts=shorts)
            if knob is not None:
                if sep or value:
                    yield knob, token[:dashes] + name, value, sep
                elif i + 1 < len(args) and _is_value(args[i + 1]):
                    yield knob, token, args[i + 1], " "
                    i += 1
        else:
            m = _KEY.match(token)
            knob = _knob_of(m.group(1), short=False, table=table, shorts=shorts) if m else None
            if knob is not None:
                yield knob, token[: len(token) - len(m.group(2)) - 1], m.group(2), "="
        i += 1


def explicit_knobs(args: Sequence[str]) -> dict[str, Explicit]:
    """Knobs the user set explicitly in ``args`` (the script's arguments, not the script).

    A value holding a placeholder (``{batch_size}``) is autotune's to fill, so not explicit.
    """
    found: dict[str, Explicit] = {}
    for knob, flag, value, sep in _scan(list(args)):
        if _PLACEHOLDER.search(value):
            found.pop(knob, None)
            continue
        found[knob] = Explicit(knob=knob, flag=flag, value=value, sep=sep)
    return found


def split_knobs(knobs: Mapping[str, float],
                args: Sequence[str]) -> tuple[dict[str, float], list[Explicit]]:
    """The knobs that may be applied to a run of ``args``, and the explicit flags that won.

    A knob the user fixed with an explicit flag is dropped: the script keeps the user's value.
    """
    explicit = explicit_knobs(args)
    kept = {k: v for k, v in knobs.items() if k not in explicit}
    return kept, [e for k, e in explicit.items() if k in knobs]


def run_length(args: Sequence[str]) -> dict[str, tuple[int, str]]:
    """How long the user asked the run to be, where the arguments say it: ``{"epochs": (90,
    "--epochs 90")}`` and/or ``{"steps": (5000, "--max_iters=5000")}``; the last one wins, and
    a value that is no whole number (a placeholder) is left out."""
    found: dict[str, tuple[int, str]] = {}
    for what, flag, value, sep in _scan(list(args), RUN_NAMES, {}):
        try:
            n = int(value)
        except ValueError:
            continue
        if n > 0:
            found[what] = (n, f"{flag}{sep}{value}")
    return found
