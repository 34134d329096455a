"""The README's commands and the `--help` examples work as printed.

Every `neuron-batch` command in the README's shell blocks (and its cron line), and every example
line in a command's `--help`, is parsed by the real CLI: each option exists and takes its value.
Those that can run on this machine (the bundled trace on the simulated device, `--help`,
`buckets suggest`) run for real and must exit 0. Commands for a Neuron host or for files the
reader supplies (`prompts.jsonl`, `/models/...`) are parsed only, in a folder where those names
exist as empty placeholders.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from neuron_batch.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TRACE = ROOT / "datasets" / "azure-llm-inference-conv-2023.csv"
#: Words that mark a command as one for a Neuron host or for the reader's own files.
ELSEWHERE = ("--device neuron", "/models/", "prompts.jsonl", "a.jsonl", "my-benchmarks.csv",
             "results/2026", "nightly.toml", "./my-model")


def _joined_lines(block: str) -> list[str]:
    """Shell lines with backslash continuations joined and comments dropped."""
    text = re.sub(r"\\\n\s*", " ", block)
    lines = []
    for line in text.splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def readme_commands() -> list[list[str]]:
    """The argument lists of every neuron-batch command in the README (the part after
    `neuron-batch`), from ```bash and ```cron blocks."""
    text = README.read_text(encoding="utf-8")
    commands = []
    for block in re.findall(r"```(?:bash|cron)\n(.*?)```", text, flags=re.S):
        for line in _joined_lines(block):
            line = line.replace(r"\%", "%").replace("$(date +%F)", "2026-12-01")
            for part in re.split(r"&&|;", line):
                words = shlex.split(part)
                for i, word in enumerate(words):
                    if word.endswith("neuron-batch"):
                        commands.append(words[i + 1:])
                        break
    return commands


def help_examples() -> list[list[str]]:
    """Every `neuron-batch ...` example line of every command's --help."""
    runner = CliRunner()
    examples = []
    for name in main.list_commands(click.Context(main)):
        command = main.get_command(click.Context(main), name)
        names = [[name]]
        if isinstance(command, click.Group):
            names = [[name, sub] for sub in command.list_commands(click.Context(command))]
        for words in names:
            result = runner.invoke(main, [*words, "--help"], terminal_width=100)
            assert result.exit_code == 0, result.output
            text = re.sub(r"\\\n\s*", " ", result.output)
            for line in text.splitlines():
                line = re.sub(r"\s+#.*$", "", line.strip())
                if line.startswith("neuron-batch "):
                    examples.append(shlex.split(line)[1:])
    return examples


def parse_only(args: list[str]) -> None:
    """Parse `args` as the CLI would, without running the command: unknown options, bad
    choices and bad values fail here."""
    with click.Context(main, info_name="neuron-batch") as top:
        name, command, rest = main.resolve_command(top, list(args))
        if isinstance(command, click.Group):
            with click.Context(command, info_name=name, parent=top) as ctx:
                name, command, rest = command.resolve_command(ctx, rest)
        command.make_context(name, list(rest), parent=top).close()


def runs_here(args: list[str]) -> bool:
    line = " ".join(args)
    return not any(word in line for word in ELSEWHERE) and args[:1] != ["doctor"]


def _placeholders(tmp_path: Path) -> None:
    for name in ("prompts.jsonl", "a.jsonl", "b.csv", "my-benchmarks.csv", "nightly.toml"):
        (tmp_path / name).write_text("", encoding="utf-8")
    (tmp_path / "my-model").mkdir()
    (tmp_path / "results" / "20261130-080000-prompts").mkdir(parents=True)


def test_the_readme_has_commands_of_each_kind():
    commands = readme_commands()
    verbs = {args[0] for args in commands if args}
    assert {"run", "plan", "bench", "doctor", "report"} <= verbs
    assert any(runs_here(args) for args in commands)
    assert any(not runs_here(args) for args in commands)


@pytest.mark.parametrize("args", [a for a in readme_commands() if not runs_here(a)],
                         ids=lambda a: " ".join(a)[:60])
def test_readme_command_parses(args, tmp_path, monkeypatch):
    _placeholders(tmp_path)
    monkeypatch.chdir(tmp_path)
    parse_only(args)


@pytest.mark.skipif(not TRACE.exists(), reason="the bundled trace is missing")
@pytest.mark.parametrize("args", [a for a in readme_commands() if runs_here(a)],
                         ids=lambda a: " ".join(a)[:60])
def test_readme_command_runs(args, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    if args[0] in ("run", "bench", "plan") and "--help" not in args:
        args = [*args, "--output", str(tmp_path / "out")]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("args", help_examples(), ids=lambda a: " ".join(a)[:60])
def test_help_example_parses(args, tmp_path, monkeypatch):
    _placeholders(tmp_path)
    for word in args:                     # inputs the example names, as placeholders
        if re.fullmatch(r"[\w.-]+\.(jsonl|csv|txt|parquet|toml)", word):
            (tmp_path / word).write_text("", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    parse_only(args)
