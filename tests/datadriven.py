"""Transcript tests: a text file of commands, each followed by the output it must produce.

The format follows etcd's testdata/ files:

    # a comment
    command arg=1 other=x
    ----
    the output the command must print,
    as many lines as it takes

A blank line ends the expected output. A test walks the file, hands each command to a
handler that drives the system under test and returns what it printed, and compares.
Run pytest with `--rewrite` to write the actual output back into the file instead of
comparing: the diff of the transcript is then the review of a behaviour change.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

SEPARATOR = "----"


@dataclass(frozen=True)
class Command:
    """One command line of a transcript: a name, key=value arguments and bare words."""

    name: str
    args: dict[str, str] = field(default_factory=dict)
    words: tuple[str, ...] = ()
    line_number: int = 0

    def int_arg(self, key: str, default: int | None = None) -> int:
        """The integer value of `key`, or `default` when absent (a missing key with no
        default is a mistake in the transcript and fails loudly)."""
        if key not in self.args:
            if default is None:
                raise KeyError(f"line {self.line_number}: {self.name} needs {key}=")
            return default
        return int(self.args[key])

    def int_list(self, key: str) -> list[int]:
        """A comma-separated list of integers, e.g. `isr=1,2,3`; empty when absent."""
        raw = self.args.get(key, "")
        return [int(part) for part in raw.split(",") if part]


@dataclass
class _Block:
    command: Command
    command_text: str
    expected: str


def parse_command(text: str, line_number: int = 0) -> Command:
    """Split `name key=value word ...` into a Command."""
    parts = text.split()
    args: dict[str, str] = {}
    words: list[str] = []
    for part in parts[1:]:
        if "=" in part:
            key, _, value = part.partition("=")
            args[key] = value
        else:
            words.append(part)
    return Command(parts[0], args, tuple(words), line_number)


def _parse(text: str) -> tuple[list[str], list[_Block]]:
    """The file as (leading lines before each block, blocks); comments and blank lines
    between blocks are kept so a rewrite changes nothing but the outputs."""
    lines = text.splitlines()
    preambles: list[str] = []
    blocks: list[_Block] = []
    pending: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip() or line.lstrip().startswith("#"):
            pending.append(line)
            i += 1
            continue
        command_text = line
        line_number = i + 1
        i += 1
        if i >= len(lines) or lines[i] != SEPARATOR:
            raise ValueError(f"line {line_number}: a command must be followed by {SEPARATOR!r}")
        i += 1
        expected: list[str] = []
        while i < len(lines) and lines[i].strip():
            expected.append(lines[i])
            i += 1
        preambles.append("\n".join(pending))
        pending = []
        blocks.append(
            _Block(parse_command(command_text, line_number), command_text, "\n".join(expected))
        )
    preambles.append("\n".join(pending))
    return preambles, blocks


def run_transcript(path: Path, handler: Callable[[Command], str], *, rewrite: bool) -> None:
    """Drive every command of `path` through `handler` and compare (or rewrite) outputs."""
    preambles, blocks = _parse(path.read_text())
    actual_outputs = [handler(block.command).rstrip("\n") for block in blocks]
    if rewrite:
        out: list[str] = []
        for preamble, block, actual in zip(preambles, blocks, actual_outputs, strict=False):
            if preamble:
                out.append(preamble)
            out.append(block.command_text)
            out.append(SEPARATOR)
            if actual:
                out.append(actual)
            out.append("")
        if preambles[-1].strip():
            out.append(preambles[-1])
        path.write_text("\n".join(out).rstrip("\n") + "\n")
        return
    for block, actual in zip(blocks, actual_outputs, strict=True):
        if actual != block.expected:
            diff = "\n".join(
                difflib.unified_diff(
                    block.expected.splitlines(),
                    actual.splitlines(),
                    "expected",
                    "actual",
                    lineterm="",
                )
            )
            raise AssertionError(
                f"{path.name}:{block.command.line_number}: {block.command_text}\n{diff}\n"
                "(run pytest with --rewrite to accept the new output)"
            )
