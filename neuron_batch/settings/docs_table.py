"""The settings table of docs/settings.md, written from the declarations (groups.py): a new
setting appears there as it does on the command line. `python -m neuron_batch.settings.docs_table`
prints it; tests/test_settings_declaration.py checks the page holds it. Pure."""

from __future__ import annotations

from neuron_batch.choices import Choice
from neuron_batch.settings.declare import Declared, Kind, Scope
from neuron_batch.settings.groups import GROUPS
from neuron_batch.settings.run_settings import DECLARED

#: What each group is, as its table's heading says.
_HEADINGS = {"job": "Job input and output", "layout": "Engine layout",
             "target": "Device target", "control": "Run control"}
BEGIN, END = "<!-- settings table: begin -->", "<!-- settings table: end -->"


def _default(d: Declared) -> str:
    value = d.default
    if d.setting.kind is Kind.PREFIX_CACHING:
        return "auto"
    if isinstance(value, Choice):
        return value.cli
    if value is None or value is False or value == ():
        return ""
    return str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def settings_table() -> str:
    """Markdown: a table per group, a row per setting."""
    lines = []
    for group in GROUPS:
        lines += [f"### {_HEADINGS[group]} (`settings.{group}`)", "",
                  "| option | in a job file | default | where | resume checks | bench | what |",
                  "|---|---|---|---|---|---|---|"]
        for d in (d for d in DECLARED if d.group == group):
            s = d.setting
            flag = f"`--{d.flag}`" if d.flag else "(argument)" if s.in_job_file else "(derived)"
            key = (f"`{d.flag or d.key}`" + (f" (or in `[{s.table}]`)" if s.table else "")
                   if s.in_job_file else "")
            where = s.scope.value if s.scope is not Scope.EVERY else "every device"
            commands = ", ".join(sorted(s.commands)) if d.flag else ""
            bench = "sweeps a list" if s.sweep else ("takes it" if "bench" in commands else "")
            lines.append(f"| {flag} | {key} | {_cell(_default(d))} | {where} | "
                         f"{'yes' if s.checked else ''} | {bench} | {_cell(s.help)} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(settings_table(), end="")
