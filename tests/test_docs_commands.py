"""Every ``mig-batch ...`` command that README.md and docs/*.md show (in code blocks and `code spans`, tables
included) exists in the CLI parser, down to its subcommand: docs and code cannot drift apart silently."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from mig_batch.cli.main import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
SPAN = re.compile(r"`([^`\n]+)`")
# "mig-batch" as a command (not mig-batchd, mig-batch-agent), then its command words (lower-case words)
COMMAND = re.compile(r"(?:^|[\s;&|($])mig-batch((?:[ \t]+[a-z][a-z0-9-]*)+)")


def code_text(markdown: str) -> list[str]:
    """The fenced code blocks and the inline code spans (outside the blocks) of ``markdown``."""
    blocks = FENCE.findall(markdown)
    return [*blocks, *SPAN.findall(FENCE.sub("", markdown))]


def documented_commands(markdown: str) -> set[tuple[str, ...]]:
    """The command words of every ``mig-batch`` invocation shown as code."""
    return {tuple(m[1].split()) for text in code_text(markdown) for m in COMMAND.finditer(text)}


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def unknown(words: tuple[str, ...], parser: argparse.ArgumentParser) -> str | None:
    """The first word that names no command where the parser expects one; None when the command exists.
    Words after a command without subcommands are its arguments (a file name, a model)."""
    for n, word in enumerate(words):
        choices = subcommands(parser)
        if not choices:
            return None
        if word not in choices:
            return " ".join(words[: n + 1])
        parser = choices[word]
    return None


def test_the_extraction_finds_commands_and_can_fail():
    text = ("| `mig-batch status [--json]` | x |\n"
            "```sh\nsudo mig-batch slurm install /etc/slurm\nmig-batchd --once\n```\n")  # fmt: skip
    assert documented_commands(text) == {("status",), ("slurm", "install")}
    parser = build_parser()
    assert unknown(("slurm", "install"), parser) is None and unknown(("plan", "queue"), parser) is None
    assert unknown(("slurm", "frobnicate"), parser) == "slurm frobnicate"
    assert unknown(("eventz",), parser) == "eventz"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_documented_command_exists(doc):
    parser = build_parser()
    wrong = sorted({u for words in documented_commands(doc.read_text()) if (u := unknown(words, parser))})
    assert not wrong, f"{doc.name} shows commands the CLI does not have: {wrong}"


def test_the_docs_show_the_commands():
    """Not vacuous: the docs together show most commands (a broken extraction would find none)."""
    shown = {words[0] for doc in DOCS for words in documented_commands(doc.read_text())}
    assert {"status", "offers", "slurm", "simulate", "bench", "events", "doctor"} <= shown, shown
