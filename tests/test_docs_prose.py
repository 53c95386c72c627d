"""Plain words in the user's documents: no sentence over 300 characters in README.md and
docs/*.md, and the names of statistical methods only in docs/internals.md. The dated run records
of docs/runs/ are kept as they were written and are not held to it.

A sentence is counted as a reader meets it: code blocks are left out, inline code and link
targets are not read as sentence ends, a link counts its text only, and each table cell,
heading and list item is read on its own. Pure text processing, no processes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIMIT_CHARS = 300
USER_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Statistics a user never needs by name: docs/internals.md names them, once, for whoever reads
# the code; user-facing text says what they do in plain words.
JARGON = ("MSER", "median-unbiased", "Bonferroni", "two looks", "A B B A")
ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "vs.", "cf.", "approx.", "no.")

_FENCE = re.compile(r"^\s*(```|~~~)")
_LIST_ITEM = re.compile(r"^\s*([-*+]|\d+[.)])\s+")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
# a sentence ends at . ! or ? (closing marks after it allowed), then space, then a capital,
# a digit, code, emphasis, a parenthesis or a quote
_END = re.compile(r"(?<=[.!?])[)\]\"'*_]*\s+(?=[A-Z0-9`*(\"'\[])")


def _blocks(text: str) -> list[str]:
    """Prose units of a Markdown text: paragraphs, list items, headings and table cells, each
    joined into one line; code blocks (fenced, or indented after a blank line) dropped."""
    units: list[str] = []
    para: list[str] = []
    in_fence = in_indented = False
    prev_blank = True

    def flush() -> None:
        if para:
            units.append(" ".join(s.strip() for s in para))
            para.clear()

    for line in text.splitlines():
        if _FENCE.match(line):
            flush()
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        blank = not line.strip()
        if in_indented and (blank or line.startswith("    ") or line.startswith("\t")):
            prev_blank = blank
            continue
        in_indented = False
        if (line.startswith("    ") or line.startswith("\t")) and prev_blank:
            flush()
            in_indented = True
            prev_blank = False
            continue
        prev_blank = blank
        stripped = line.strip().lstrip(">").strip()
        if blank or not stripped:
            flush()
        elif stripped.startswith("|"):
            flush()
            cells = [c.strip() for c in stripped.strip("|").split("|")]
            units.extend(c for c in cells if c and not set(c) <= set("-: "))
        elif stripped.startswith("#"):
            flush()
            units.append(stripped.lstrip("#").strip())
        elif _LIST_ITEM.match(line):
            flush()
            para.append(_LIST_ITEM.sub("", line, count=1).strip())
        else:
            para.append(stripped)
    flush()
    return units


def _masked(unit: str) -> str:
    """Inline code kept in length but blanked, so that a dot inside it ends nothing; the
    abbreviations' dots too."""
    masked = _CODE_SPAN.sub(lambda m: m.group(1) + "x" * len(m.group(2)) + m.group(1), unit)
    for abbr in ABBREVIATIONS:
        masked = masked.replace(abbr, abbr.replace(".", "\x00"))
    return masked


def sentences(text: str) -> list[str]:
    """The sentences of a Markdown text, as a reader meets them (see the module's docstring)."""
    out: list[str] = []
    for unit in _blocks(text):
        unit = _LINK.sub(lambda m: m.group(1), unit)  # a link reads as its text
        start = 0
        for m in _END.finditer(_masked(unit)):
            out.append(unit[start:m.start()].strip())
            start = m.end()
        out.append(unit[start:].strip())
    return [s for s in out if s]


def test_the_splitter_reads_sentences_as_a_reader_does():
    text = ("# Title\n\nOne short. Two `a.b. C` and [a link. Here](http://x.y/z. W) end.\n\n"
            "    code. Block. Lines\n\n- item one. Item two\n\n| a. B | c |\n|---|---|\n"
            "```\nfenced. Code\n```\ne.g. This stays one.\n")
    assert sentences(text) == ["Title", "One short.", "Two `a.b. C` and a link.", "Here end.",
                               "item one.", "Item two", "a.", "B", "c", "e.g. This stays one."]


@pytest.mark.parametrize("path", USER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_sentence_over_the_limit(path):
    long = [s for s in sentences(path.read_text()) if len(s) > LIMIT_CHARS]
    shown = "\n".join(f"  {len(s)}: {s[:120]}..." for s in long)
    assert not long, f"{len(long)} sentence(s) over {LIMIT_CHARS} characters:\n{shown}"


@pytest.mark.parametrize("path", [p for p in USER_DOCS if p.name != "internals.md"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_statistics_are_named_only_in_internals(path):
    text = path.read_text()
    found = [term for term in JARGON if term.lower() in text.lower()]
    assert not found, f"{path.name} names {found}: say what it does, name it in internals.md"


def test_internals_names_the_statistics_and_links_nothing_outside_the_repository():
    text = (ROOT / "docs" / "internals.md").read_text()
    assert all(term.lower() in text.lower() for term in JARGON)
    outside = [t for t in re.findall(r"\]\(([^)]+)\)", text)
               if t.startswith("/") or t.startswith("../../")]
    assert not outside, f"links outside the repository: {outside}"
    assert "../shared/" not in text and "DESIGN.md" not in text, "names design files outside it"
