"""`--help` stays short: every option's help is at most three lines as click renders it at 100
columns (the details are in the README). Pure: builds the help text, runs nothing."""

from __future__ import annotations

import click

from neuron_batch.cli import main

WIDTH = 100
MOST_LINES = 3


def commands(group: click.Group, path: tuple[str, ...] = ()):
    for name, command in group.commands.items():
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name))


def help_lines(command: click.Command, name: str) -> dict[str, int]:
    """Option -> the lines its help takes in `command --help` (its first column left out when
    click puts the help below a long one)."""
    ctx = click.Context(command, info_name=name, terminal_width=WIDTH, max_content_width=WIDTH)
    text = command.get_help(ctx).splitlines()
    records = [(p.name, p.get_help_record(ctx)) for p in command.get_params(ctx)]
    first = {record[0]: pname for pname, record in records if record}
    rows = [(i, first[line.strip().split("  ")[0]]) for i, line in enumerate(text)
            if line.startswith("  -") and line.strip().split("  ")[0] in first]
    out = {}
    for k, (start, pname) in enumerate(rows):
        end = rows[k + 1][0] if k + 1 < len(rows) else len(text)
        lines = [line for line in text[start:end] if line.strip()]
        lines = [lines[0]] + [line for line in lines[1:] if line.startswith(" " * 6)]
        below = lines[0].strip() in first          # the name alone on its line
        out[pname] = len(lines) - below
    return out


def test_every_option_help_is_three_lines_at_most():
    long = {f"{' '.join(path)} {option}": n for path, command in commands(main)
            for option, n in help_lines(command, " ".join(path)).items() if n > MOST_LINES}
    assert not long, f"option help over {MOST_LINES} lines at {WIDTH} columns: {long}"


def test_the_count_sees_a_long_help():
    @click.command()
    @click.option("--short", help="One line.")
    @click.option("--a-rather-long-option-name-indeed", help="word " * 60)
    def planted(**_):
        pass

    counted = help_lines(planted, "planted")
    assert counted["short"] == 1 and counted["a_rather_long_option_name_indeed"] > MOST_LINES


def test_run_help_lists_a_short_common_section_then_the_settings_by_concern():
    from neuron_batch.settings import DECLARED

    ctx = click.Context(main.commands["run"], info_name="run", terminal_width=WIDTH,
                        max_content_width=WIDTH)
    text = main.commands["run"].get_help(ctx)
    titles = [line for line in text.splitlines() if line.endswith(":") and
              not line.startswith(" ")]
    assert titles[:5] == ["Common options:", "Input and output:", "Engine layout:",
                          "Device:", "Run control:"], titles
    common = text.split("Common options:")[1].split("Input and output:")[0]
    assert "--max-num-seqs" in common and "--kv-reserve" not in common
    assert len(common.strip().splitlines()) < 40          # (short: a first run's options)
    for d in DECLARED:                                    # every option once, in one section
        if d.flag and "run" in d.setting.commands:
            assert text.count(f"--{d.flag} ") + text.count(f"--{d.flag}\n") >= 1, d.flag


def test_an_option_or_job_file_key_a_command_lacks_names_the_commands_that_take_it(tmp_path):
    from click.testing import CliRunner

    flag = CliRunner().invoke(main, ["report", str(tmp_path), "--device", "sim"])
    assert flag.exit_code == 2
    assert "No such option: --device; `bench` and `run` take it" in flag.output
    job = tmp_path / "job.toml"
    job.write_text("max-num-seqs = 4\nmax-runtime = 60\n")
    keyed = CliRunner().invoke(main, ["bench", "x.jsonl", "--config", str(job)])
    assert keyed.exit_code == 2
    assert "'max-runtime' is no option of `bench` (`run` takes it)" in keyed.output
