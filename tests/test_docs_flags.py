"""docs/usage.md is the one place every flag, knob and placeholder is written down: this test
holds it to the code. It builds the parser (no process runs) and reads the file."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from autotune.commands.cli import build_parser
from autotune.launching.rank_command import KNOB_PLACEHOLDERS
from autotune.tuning.space.knobs import ALIASES, ORDER

ROOT = Path(__file__).resolve().parent.parent
USAGE = ROOT / "docs" / "usage.md"
# flags of scripts and engines the text shows in examples: never autotune's own
SCRIPT_FLAGS = {"--batch-size", "--epochs", "--max_iters", "--max_steps", "--num_train_epochs",
                "--trainer", "--cpus-per-task"}
_FLAG = re.compile(r"(?<![\w-])--?[a-zA-Z][\w-]*")


def _parser_flags() -> dict[str, set[str]]:
    """command -> its option strings, as --help lists them (``-h``/``--help`` left out;
    ``recipes`` holds its subcommands' flags; ``autotune`` the top level's)."""
    out: dict[str, set[str]] = {}

    def walk(parser: argparse.ArgumentParser, command: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, name if command == "autotune" else command)
            elif not isinstance(action, argparse._HelpAction):
                out.setdefault(command, set()).update(action.option_strings)

    walk(build_parser(), "autotune")
    return out


def _documented_flags() -> dict[str, set[str]]:
    """command -> flags, from the table of the section "Every flag"."""
    text = USAGE.read_text()
    section = text.split("\n## Every flag\n", 1)[1].split("\n## ", 1)[0]
    out: dict[str, set[str]] = {}
    for row in section.splitlines():
        if not row.startswith("| `-"):
            continue
        flag_cell, commands_cell = re.split(r"(?<!\\)\|", row)[1:3]
        flags = {f for f in _FLAG.findall(flag_cell) if f.startswith("-")}
        for command in re.findall(r"`([a-z]+)`", commands_cell):
            out.setdefault(command, set()).update(flags)
    return out


def test_every_flag_of_every_command_is_in_the_table_and_nothing_else():
    code, docs = _parser_flags(), _documented_flags()
    for command in sorted(code.keys() | docs.keys()):
        missing = sorted(code.get(command, set()) - docs.get(command, set()))
        gone = sorted(docs.get(command, set()) - code.get(command, set()))
        assert not missing, (f"autotune {command}: {missing} in --help but not in "
                             f"docs/usage.md's \"Every flag\" table")
        assert not gone, (f"autotune {command}: {gone} in docs/usage.md's \"Every flag\" "
                          f"table but not in --help")


def test_every_flag_the_text_names_exists():
    known = set().union(*_parser_flags().values()) | SCRIPT_FLAGS | {"-h", "--help"}
    named = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", USAGE.read_text()))
    assert not named - known, f"docs/usage.md names flags autotune lacks: {sorted(named - known)}"


def test_every_knob_and_its_alias_is_documented():
    text = USAGE.read_text()
    missing = [k for k in (*ORDER, *ALIASES) if f"`{k}`" not in text and f"`{k}=" not in text]
    assert not missing, f"knobs missing from docs/usage.md: {missing}"


def test_every_placeholder_is_documented_and_no_other():
    text = USAGE.read_text()
    missing = [p for p in KNOB_PLACEHOLDERS if f"`{{{p}}}`" not in text]
    assert not missing, f"placeholders missing from docs/usage.md: {missing}"
    named = set(re.findall(r"`[^`]*\{([a-z_]+)\}[^`]*`", text))
    assert named <= set(KNOB_PLACEHOLDERS), f"not placeholders: {sorted(named - set(KNOB_PLACEHOLDERS))}"


def test_space_help_names_every_knob():
    tune = build_parser()._subparsers._group_actions[0].choices["tune"]
    space = next(a for a in tune._actions if "--space" in a.option_strings)
    missing = [k for k in ORDER if k not in space.help]
    assert not missing, f"--space's help omits {missing}"
