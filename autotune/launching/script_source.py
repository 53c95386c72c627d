"""What a Python script's own source says before it runs: whether it could ever join a process
group when started as ``torchrun`` starts ranks.

The tuner learns whether a script trains data-parallel from a probe of two ranks
(`autotune.tuning.baseline.discover_ranks`), 11 to 40 s of a 5-minute budget on the scripts
measured. A script whose source never names anything that starts or joins a process group
cannot answer yes, so that probe is left out for it. The read is conservative: it answers
"never" only when every file the script imports from its own tree was read and none of them
names torch.distributed, DDP, FSDP, a rank variable, a launcher or a spawn, and every other
import is the standard library or a package known not to start ranks. Anything it cannot
follow (a command that is not a Python file, a file it cannot parse, a dynamic import, a
package it does not know, such as ``transformers``, ``lightning`` or ``accelerate``) means the
probe runs as before.

`never_parallel` reads files; `markers_in` and `unknown_packages` are pure over text.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from autotune.launching.rank_command import is_python_script

# Names in a file's text that may start or join a process group, or start ranks, whether in
# code or in a comment (a comment costs one probe; a miss would cost the speed-up).
MARKERS = re.compile(
    r"\b(?:distributed|Distributed\w*|DDP|FSDP|FullyShardedDataParallel|fully_shard|"
    r"init_process_group|process_group|nccl|gloo|torchrun|torch\.multiprocessing|spawn|"
    r"RANK|\w+_RANK|\w*WORLD_SIZE|MASTER_ADDR|MASTER_PORT|SLURM_PROCID|SLURM_NTASKS|"
    r"OMPI_COMM_WORLD_\w+|PMI_SIZE|horovod|deepspeed|mpi4py|import_module|__import__|runpy|"
    r"exec)\b")
# Standard-library modules through which a script may start other Python processes.
STARTS_PROCESSES = frozenset({"multiprocessing", "subprocess", "concurrent", "runpy",
                              "importlib", "pty"})
# Packages outside the standard library known to start no ranks and join no process group.
KNOWN_ALONE = frozenset({
    "torch", "torchvision", "torchaudio", "torchtext", "numpy", "scipy", "pandas", "PIL",
    "matplotlib", "tqdm", "tiktoken", "sentencepiece", "tokenizers", "regex", "requests",
    "yaml", "h5py", "einops", "safetensors", "psutil", "packaging", "typing_extensions",
    "sklearn", "tensorboard", "wandb", "onnx", "filelock", "fsspec", "jinja2", "six",
})
# Packages that start ranks only through some of their names (the HF Trainer and its kin):
# ``from transformers import GPT2LMHeadModel`` (minGPT loading weights) starts none.
ALONE_UNLESS_NAMED = {"transformers": re.compile(r"Trainer|Training|Accelerat|[Dd]eep[Ss]peed|"
                                                 r"[Dd]istributed|FSDP")}
MAX_FILES = 300  # a tree larger than this is not read: the probe runs
MAX_BYTES = 4 << 20


@dataclass(frozen=True)
class Reading:
    """What the read found: the files read, and why it cannot say "never" ("" when it can)."""

    files: tuple[str, ...]
    maybe: str = ""

    @property
    def never(self) -> bool:
        return not self.maybe and bool(self.files)

    def why_never(self, script: str) -> str:
        """The reason text for the space's note, once `never` holds."""
        others = len(self.files) - 1
        read = f"{Path(script).name}" + (f" and {others} module(s) of its own" if others else "")
        return (f"its source never starts torch.distributed ({read} read: no process group, "
                f"DDP, rank variable, launcher or spawn), so extra ranks would each train alone")


def markers_in(text: str) -> list[str]:
    """Pure: the marker words in ``text``, each once, in order of appearance."""
    return list(dict.fromkeys(m.group(0) for m in MARKERS.finditer(text)))


def unknown_packages(tops: Iterable[str], *, stdlib: Iterable[str] = sys.stdlib_module_names
                     ) -> list[str]:
    """Pure: the top-level imports (not found in the script's tree) that may start ranks: not
    the standard library, or a standard module that starts processes, and not `KNOWN_ALONE`."""
    std = set(stdlib)
    return sorted({t for t in tops if (t not in std and t not in KNOWN_ALONE)
                   or t in STARTS_PROCESSES})


def _alone_by_names(module: str, names: Sequence[str]) -> bool:
    """Pure: ``from module import names`` of a package in `ALONE_UNLESS_NAMED` that names
    none of its rank-starting classes."""
    launching = ALONE_UNLESS_NAMED.get(module.split(".")[0])
    return bool(launching and names and "*" not in names
                and not any(launching.search(n) for n in names))


def _imports(tree: ast.AST) -> Iterable[tuple[str, int, tuple[str, ...]]]:
    """(module, relative level, names imported from it) of every import, nested ones too."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, 0, ()
        elif isinstance(node, ast.ImportFrom):
            yield node.module or "", node.level, tuple(a.name for a in node.names)


def _module_files(roots: Sequence[Path], dotted: str) -> list[Path]:
    """The files importing ``dotted`` runs, found under one of ``roots`` (its packages'
    ``__init__.py`` too); empty when none of the roots holds it."""
    parts = dotted.split(".")
    for root in roots:
        found, here = [], root
        for i, part in enumerate(parts):
            here = here / part
            last = i == len(parts) - 1
            if here.is_dir() and (here / "__init__.py").is_file():
                found.append(here / "__init__.py")
            elif last and here.with_suffix(".py").is_file():
                found.append(here.with_suffix(".py"))
            elif here.is_dir() and not last:  # a namespace package
                continue
            else:
                found = []
                break
        if found:
            return found
    return []


def read_script(script: Path, roots: Sequence[Path]) -> Reading:
    """Read ``script`` and the modules of its own tree it imports (found under ``roots``: its
    directory and ``PYTHONPATH``), to the end or to the first reason it may start ranks."""
    todo, seen, total = [script.resolve()], set(), 0
    tops: set[str] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        if len(seen) > MAX_FILES:
            return Reading(tuple(map(str, seen)), f"more than {MAX_FILES} files to read")
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
            total += len(text)
            tree = ast.parse(text, filename=str(path))
        except (OSError, SyntaxError, ValueError) as exc:
            return Reading(tuple(map(str, seen)), f"cannot read {path}: {exc}")
        if total > MAX_BYTES:
            return Reading(tuple(map(str, seen)), f"more than {MAX_BYTES >> 20} MiB to read")
        found = markers_in(text)
        if found:
            return Reading(tuple(map(str, seen)), f"{path.name} names {found[0]}")
        package = path.parent
        for module, level, names in _imports(tree):
            if level:  # relative to this file's package
                base = package
                for _ in range(level - 1):
                    base = base.parent
                dotted = module
                local_roots = [base]
            else:
                dotted, local_roots = module, list(roots)
            candidates = [f"{dotted}.{n}" if dotted else n for n in names if n != "*"]
            files = _module_files(local_roots, dotted) if dotted else \
                [init for init in [local_roots[0] / "__init__.py"] if init.is_file()]
            for sub in candidates:  # ``from pkg import module``
                files += _module_files(local_roots, sub)
            if files:
                todo.extend(f.resolve() for f in files)
            elif level:
                return Reading(tuple(map(str, seen)),
                               f"{path.name} imports .{module or ''} that was not found")
            elif not _alone_by_names(dotted, names):
                tops.add(dotted.split(".")[0])
    unknown = unknown_packages(tops)
    if unknown:
        return Reading(tuple(map(str, seen)), f"it imports {', '.join(unknown)}")
    return Reading(tuple(map(str, seen)))


def never_parallel(command: Sequence[str], cwd: str, env: Mapping[str, str]) -> str:
    """Why the script can never join a process group, read from its source ("" when it may,
    or when the read cannot tell): the reason the two-rank probe is left out."""
    if not command or not is_python_script(command[0]):
        return ""
    script = Path(cwd, command[0])
    if not script.is_file():
        return ""
    roots = [script.resolve().parent]  # sys.path[0], as Python sets it for a script
    roots += [Path(cwd, p).resolve() for p in env.get("PYTHONPATH", "").split(":") if p]
    reading = read_script(script, list(dict.fromkeys(roots)))
    return reading.why_never(command[0]) if reading.never else ""
