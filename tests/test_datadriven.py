"""The transcript runner itself: comparison, failure message, and --rewrite."""

from __future__ import annotations

import pytest

from tests.datadriven import Command, parse_command, run_transcript

TRANSCRIPT = """# adds numbers
add a=1 b=2
----
3

echo hello world
----
hello world
"""


def handler(command: Command) -> str:
    if command.name == "add":
        return str(command.int_arg("a") + command.int_arg("b"))
    return " ".join(command.words)


def test_matching_transcript_passes(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text(TRANSCRIPT)
    run_transcript(path, handler, rewrite=False)


def test_mismatch_names_the_line_and_shows_a_diff(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text(TRANSCRIPT.replace("\n3\n", "\n4\n"))
    with pytest.raises(AssertionError, match=r"t.txt:2: add a=1 b=2(.|\n)*-4(.|\n)*\+3"):
        run_transcript(path, handler, rewrite=False)


def test_rewrite_replaces_only_outputs(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text(TRANSCRIPT.replace("\n3\n", "\nstale\nlines\n"))
    run_transcript(path, handler, rewrite=True)
    assert path.read_text() == TRANSCRIPT


def test_command_arguments():
    command = parse_command("isr-shrink isr=1,2 leader=1 force", 7)
    assert command.int_list("isr") == [1, 2]
    assert command.int_arg("leader") == 1
    assert command.words == ("force",)
    with pytest.raises(KeyError, match="line 7"):
        command.int_arg("missing")
