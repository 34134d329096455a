"""The commands' click class: `--help` in sections (what a first run needs, then the settings
by concern, as settings/groups.py groups them) and an option a command does not take refused
with the commands that do take it. Click has no sections of its own: `format_options` writes
them. Imports only the declarations (no vLLM: `--help` stays fast)."""

from __future__ import annotations

from collections.abc import Iterator

import click

from neuron_batch.settings import BY_NAME

#: The first section of a command's --help: what a first run sets (where the command takes it).
COMMON = ("config", "output", "model", "device", "instance", "architecture", "max_num_seqs",
          "max_model_len", "max_tokens", "quiet", "resume", "help")
#: A section per settings group (RunSettings' groups), in this order.
SECTIONS = {"job": "Input and output", "layout": "Engine layout", "target": "Device",
            "control": "Run control"}
#: An option that belongs to a setting it spells otherwise.
ALIASES = {"no_prefix_caching": "prefix_caching"}


class SettingsCommand(click.Command):
    """A command of neuron-batch (every one: the group makes them of this class)."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections: dict[str, list[tuple[str, str]]] = {}
        common: dict[str, tuple[str, str]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None or isinstance(param, click.Argument):
                continue        # (the arguments are in the usage line and the text)
            name = ALIASES.get(param.name or "", param.name or "")
            if param.opts and "--help" in param.opts:
                name = "help"
            declared = BY_NAME.get(name)
            if name in COMMON:
                common[name] = record
            else:
                sections.setdefault(declared.group if declared is not None else "own",
                                    []).append(record)
        sections["common"] = [common[name] for name in COMMON if name in common]
        if len([k for k in sections if k in SECTIONS]) < 2:    # (few settings: one list)
            super().format_options(ctx, formatter)
            return
        titles = {"common": "Common options", "own": f"{(ctx.info_name or '').title()} "
                                                     f"options", **SECTIONS}
        for key in ("common", "own", *SECTIONS):
            if sections.get(key):
                with formatter.section(titles[key]):
                    formatter.write_dl(sections[key])

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as error:
            takers = commands_taking(ctx, option=error.option_name)
            if not takers:
                raise
            raise click.NoSuchOption(
                error.option_name, possibilities=error.possibilities, ctx=ctx,
                message=(f"No such option: {error.option_name}; {_listed(takers)} "
                         f"take{'s' if len(takers) == 1 else ''} it")) from None


class SettingsGroup(click.Group):
    """The `neuron-batch` group: its commands (and subgroups') are SettingsCommands."""

    command_class = SettingsCommand
    group_class = type

    def resolve_command(self, ctx: click.Context, args: list[str]
                        ) -> tuple[str | None, click.Command | None, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        if ctx.parent is None and name != "run":
            # Only `run` takes a signal the command line held while it started (job/stop.py);
            # any other command gets it now, as it came.
            from neuron_batch.job.stop import release_early_signals

            release_early_signals()
        return name, command, rest


def commands_taking(ctx: click.Context, *, option: str | None = None,
                    param: str | None = None) -> list[str]:
    """The commands (as typed: `buckets suggest`) that take `option` (a flag) or `param` (a
    parameter's name: a job file's setting)."""
    root = ctx.find_root().command
    return [" ".join(path) for path, command in _walk(root)
            if any((option is not None and option in p.opts) or
                   (param is not None and p.name == param) for p in command.params)]


def _walk(command: click.Command, path: tuple[str, ...] = ()
          ) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from _walk(sub, (*path, name))
    elif path:
        yield path, command


def _listed(names: list[str]) -> str:
    quoted = [f"`{n}`" for n in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} and {quoted[-1]}"
