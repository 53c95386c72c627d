"""The shape of the house, read from the source (AST), not from running it.

Every import counts, wherever it stands: at module level, inside a function, under
``TYPE_CHECKING``. A cycle hidden in a function or a type hint is still a cycle of ideas.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("autotune", "probes")

# Where each outside system enters: the only modules (or packages, ending in "/") that import it.
ENTRY = {
    "optuna": ("autotune/tuning/study.py",),
    "rich": ("autotune/monitor/",),
    "pynvml": ("autotune/hardware/nvml.py",),
    "subprocess": ("autotune/hardware/proc.py",),
}

# The controller's packages, lowest first: a package imports only those before it (and the
# `autotune` root, which holds the error tree). docs/internals.md's layer table says the same.
LAYERS = ("store", "hardware", "launching", "measuring", "tuning", "monitor", "report", "commands")

# Private names used across modules: none. A debt taken on purpose would be listed here, so that
# a new one still fails.
KNOWN_PRIVATE: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Import:
    path: str  # the importing file, relative to the project root
    line: int
    target: str  # the module imported (ours: resolved to a module of ours; else as written)
    name: str | None = None  # the name taken from it, when not a module itself


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(f.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = f
    return out


MODULES = _modules()


def _ours(name: str) -> str:
    """The module of ours that ``name`` (a module or a name in one) lives in."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _imports(module: str) -> tuple[list[Import], dict[str, str]]:
    """Every import of ``module``, and the names it binds to modules of ours."""
    f = MODULES[module]
    rel = str(f.relative_to(ROOT))
    package = module if f.name == "__init__.py" else module.rpartition(".")[0]
    out: list[Import] = []
    bound: dict[str, str] = {}
    for node in ast.walk(ast.parse(f.read_text(), filename=rel)):
        if isinstance(node, ast.Import):
            for a in node.names:
                ours = a.name.split(".")[0] in PACKAGES
                out.append(Import(rel, node.lineno, _ours(a.name) if ours else a.name))
                if ours and a.asname:
                    bound[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            if base.split(".")[0] not in PACKAGES:
                out.extend(Import(rel, node.lineno, base, a.name) for a in node.names)
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in MODULES:
                    out.append(Import(rel, node.lineno, sub))
                    bound[a.asname or a.name] = sub
                else:
                    out.append(Import(rel, node.lineno, _ours(base), a.name))
    return out, bound


IMPORTS = {m: _imports(m) for m in MODULES}


def _cycles() -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    graph = {m: sorted({i.target for i in imps if i.target in MODULES and i.target != m})
             for m, (imps, _) in IMPORTS.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_among_our_modules():
    report = []
    for group in _cycles():
        edges = sorted({f"  {i.path}:{i.line} imports {i.target}" for m in group
                        for i in IMPORTS[m][0] if i.target in group and i.target != m})
        report.append(" <-> ".join(group) + "\n" + "\n".join(edges))
    assert not report, "import cycles:\n" + "\n".join(report)


def _package(module: str) -> str | None:
    """The controller package a module of ours belongs to; None for the root and `probes`."""
    parts = module.split(".")
    if parts[0] != "autotune" or len(parts) < 2 or parts[1] in ("__main__",):
        return None
    return parts[1]


def test_every_controller_package_has_a_declared_layer():
    found = {_package(m) for m in MODULES} - {None}
    assert found == set(LAYERS), (f"packages without a layer: {sorted(found - set(LAYERS))}; "
                                  f"layers without a package: {sorted(set(LAYERS) - found)}")


def test_packages_import_only_the_layers_below_them():
    """No package cycle: a module of one package imports nothing from its own layer's peers or
    from a higher layer, wherever the import stands."""
    wrong = []
    for module, (imps, _) in IMPORTS.items():
        own = _package(module)
        if own is None:
            continue
        for i in imps:
            other = _package(i.target) if i.target in MODULES else None
            if other and other != own and LAYERS.index(other) > LAYERS.index(own):
                wrong.append(f"  {i.path}:{i.line} imports {i.target} ({own} is below {other})")
    assert not wrong, f"imports against the layers {' < '.join(LAYERS)}:\n" + "\n".join(wrong)


def _private_uses() -> set[tuple[str, str, int]]:
    """(file, module.name, line) of every private name of one module used in another."""
    uses = set()
    for module, (imps, bound) in IMPORTS.items():
        for i in imps:
            if i.name and i.name.startswith("_") and not i.name.startswith("__") \
                    and i.target in MODULES and i.target != module:
                uses.add((i.path, f"{i.target}.{i.name}", i.line))
        tree = ast.parse(MODULES[module].read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in bound and node.attr.startswith("_") \
                    and not node.attr.startswith("__") and bound[node.value.id] != module:
                rel = str(MODULES[module].relative_to(ROOT))
                uses.add((rel, f"{bound[node.value.id]}.{node.attr}", node.lineno))
    return uses


def test_no_private_name_is_used_across_modules():
    uses = _private_uses()
    new = sorted(u for u in uses if u[:2] not in KNOWN_PRIVATE)
    assert not new, "private names used across modules:\n" + "\n".join(
        f"  {path}:{line} uses {name}" for path, name, line in new)
    fixed = KNOWN_PRIVATE - {u[:2] for u in uses}
    assert not fixed, f"no longer used across modules, drop from KNOWN_PRIVATE: {sorted(fixed)}"


def test_each_outside_system_enters_in_one_place():
    wrong = []
    for imps, _ in IMPORTS.values():
        for i in imps:
            top = i.target.split(".")[0]
            if top in ENTRY and not any(i.path == e or (e.endswith("/") and i.path.startswith(e))
                                        for e in ENTRY[top]):
                wrong.append(f"  {i.path}:{i.line} imports {i.target} (enters in {ENTRY[top]})")
    assert not wrong, "outside systems imported elsewhere:\n" + "\n".join(wrong)


def test_the_two_sides_meet_only_in_the_protocol():
    """probes/ imports nothing of autotune/; autotune/ imports only `probes.protocol`."""
    wrong = []
    for module, (imps, _) in IMPORTS.items():
        side = module.split(".")[0]
        for i in imps:
            top = i.target.split(".")[0]
            if side == "probes" and top in ("autotune", "optuna", "rich"):
                wrong.append(f"  {i.path}:{i.line} imports {i.target}")
            if side == "autotune" and top == "probes" and i.target != "probes.protocol":
                wrong.append(f"  {i.path}:{i.line} imports {i.target}")
    assert not wrong, "the sides meet outside probes.protocol:\n" + "\n".join(wrong)


# -- sizes ---------------------------------------------------------------------------------------
MAX_FUNCTION_LINES = 80  # def line to last line, docstring included
MAX_CLASS_LINES = 400

# Over the limit and being split by other work now; each entry names the work that owns it.
# Drop an entry once its piece is split: the test fails on an entry that no longer needs it.
OVERSIZE_ALLOWED: set[tuple[str, str]] = set()


def _oversize() -> set[tuple[str, str, str, int]]:
    """(file, name, "function" | "class", lines) of every piece of autotune/ over its limit."""
    out = set()
    for module, f in MODULES.items():
        if not module.startswith("autotune"):
            continue
        rel = str(f.relative_to(ROOT))
        for node in ast.walk(ast.parse(f.read_text(), filename=rel)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                lines = node.end_lineno - node.lineno + 1
                what = "class" if isinstance(node, ast.ClassDef) else "function"
                limit = MAX_CLASS_LINES if what == "class" else MAX_FUNCTION_LINES
                if lines > limit:
                    out.add((rel, node.name, what, lines))
    return out


def test_no_function_over_80_lines_and_no_class_over_400_in_autotune():
    found = _oversize()
    new = sorted(o for o in found if o[:2] not in OVERSIZE_ALLOWED)
    assert not new, "split where the idea splits:\n" + "\n".join(
        f"  {path}: {what} {name} is {lines} lines" for path, name, what, lines in new)
    fixed = OVERSIZE_ALLOWED - {o[:2] for o in found}
    assert not fixed, f"within the limits now, drop from OVERSIZE_ALLOWED: {sorted(fixed)}"


# -- values that decide are enums, not strings ---------------------------------------------------
# The text of each enum whose members decide: the launcher kind (`engines.Kind`), a result's
# source (`series.Source`), the probe mode (`protocol.Mode`), the run kind (`events.RunKind`)
# and the error kind (`protocol.ErrorKind`). An attribute of one of these names compared with
# one of these strings is a string deciding where the enum should.
DECIDING = {
    "kind": {"local", "mpirun", "srun", "tune", "wrap", "probe", "run"},
    "source": {"dataloader", "steps", "metric", "none"},
    "mode": {"full", "synthetic", "io"},
    "error_kind": {"oom", "exception", "stop_iteration"},
}


def _texts(node: ast.AST) -> set[str]:
    """The string constants ``node`` is or holds (a tuple, list or set of them)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*map(_texts, node.elts)) if node.elts else set()
    return set()


def _string_decisions(source: str, path: str) -> list[str]:
    """``path:line`` and the comparison, for every attribute named in `DECIDING` compared with
    one of its enum's texts."""
    found = []
    for node in ast.walk(ast.parse(source, filename=path)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        for a, b in zip(sides, sides[1:]):
            for attr, other in ((a, b), (b, a)):
                if isinstance(attr, ast.Attribute) and attr.attr in DECIDING \
                        and _texts(other) & DECIDING[attr.attr]:
                    found.append(f"  {path}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_string_rule_finds_what_it_should_and_nothing_else():
    bad = ('launcher.kind == "local"\nx.mode != "io"\n"oom" == obs.error_kind\n'
           'r.source in ("metric", "steps")\n')
    assert len(_string_decisions(bad, "bad.py")) == 4
    good = ('fit.kind == "gpu"\nkind == "local"\nlauncher.kind is Kind.LOCAL\n'
            'msg.get("kind") == "oom"\nr.source == other.source\nx.name == "local"\n')
    assert _string_decisions(good, "good.py") == []


def test_deciding_values_are_compared_as_enums_not_strings():
    found = []
    for module, f in MODULES.items():
        if module.startswith("autotune"):
            rel = str(f.relative_to(ROOT))
            found += _string_decisions(f.read_text(), rel)
    assert not found, "compare by the enum's member, not its text:\n" + "\n".join(found)
