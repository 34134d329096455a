"""The commands' options of the declared settings (settings/groups.py), `--config` job files,
and turning parsed options into validated `RunSettings`: click's side of the declarations."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from neuron_batch.choices import (
    PREFIX_CACHING,
    Choice,
    parse_prefix_caching,
    prefix_caching_word,
)
from neuron_batch.scheduler.kv_reserve import parse_kv_reserve
from neuron_batch.settings import (
    BY_NAME,
    DECLARED,
    SPLIT_AUTO,
    RunSettings,
    SettingsError,
    parse_buckets_option,
)
from neuron_batch.settings.declare import Declared, Kind, Scope
from neuron_batch.settings.job_file import load_config_file

EXIT_CODES_HELP = """\b
Exit codes:
  0  every request completed
  1  the run failed (engine or system error); finished outputs are kept
  2  bad usage or bad input, or --output holds a run of other input; nothing was run
  3  partial: finished, but some inputs were skipped (--on-error skip) or failed
  4  interrupted (SIGTERM, SIGINT, --max-runtime); --resume continues
  5  the output folder is in use by another run"""

BUILTIN_PROMPTS = Path(__file__).parents[1] / "data" / "example_prompts.jsonl"


def load_config_option(ctx: click.Context, param: click.Parameter, value: str | None):
    """--config job.toml: its settings become the defaults; command-line options still win."""
    if value is None:
        return None
    try:
        settings = load_config_file(value)
        if "prefix_caching" in settings:     # (TOML's true/false, or auto/on/off)
            parse_prefix_caching(settings["prefix_caching"], f"{value}: prefix-caching")
    except (SettingsError, ValueError) as error:
        raise click.BadParameter(str(error), ctx=ctx, param=param) from None
    taken = {p.name for p in ctx.command.params}
    refused = [name for name in settings if name not in taken]
    if refused:
        from neuron_batch.cli.command import commands_taking

        words = []
        for name in refused:
            takers = commands_taking(ctx, param=name)
            key = BY_NAME[name].key.replace("_", "-")
            words.append(f"{key!r} is no option of `{ctx.info_name}`"
                         + (f" ({', '.join(f'`{t}`' for t in takers)} "
                            f"take{'s' if len(takers) == 1 else ''} it)" if takers else ""))
        raise click.BadParameter(f"{value}: " + "; ".join(words), ctx=ctx, param=param)
    ctx.default_map = {**(ctx.default_map or {}), **settings}
    return value



#: The click type of each kind of value a setting takes (declare.py Kind); a kind absent here
#: is text, parsed where the options become settings (bucket lists, KV rules) so the message
#: names the option as `run` always has.
_TYPES = {Kind.INT: int, Kind.FLOAT: float, Kind.FOLDER: click.Path(file_okay=False),
          Kind.FILE: click.Path(dir_okay=False)}


def _option_of(d: Declared, help: str | None = None, command: str | None = None
               ) -> Callable[[Any], Any]:
    """The click option of declared setting `d`: its flag(s), type, default,
    environment variable and help, its scope as a [sim]/[neuron] tag; in `command`, the help
    it declares for that command (which says the default there)."""
    s = d.setting
    flag = f"--{d.flag}"
    names = [flag] + ([s.short] if s.short else []) + [d.name]
    own = dict(s.help_in).get(command or "") if help is None else None
    text = help if help is not None else own if own is not None else s.help
    if s.scope in (Scope.SIM, Scope.NEURON) and help is None and own is None:
        text = f"[{s.scope.value}] {text}"      # (a command's own help knows)
    kwargs: dict[str, Any] = {"help": text, "envvar": s.envvar, "metavar": s.metavar}
    default = d.default.value if isinstance(d.default, Choice) else d.default
    if s.sweep:                     # a list in bench (swept), one value in run
        kwargs.update(default=str(default), show_default=s.show_default)
    elif s.kind is Kind.FLAG:
        kwargs.update(is_flag=True, default=False)
    elif s.kind is Kind.SWITCH:
        names[0] = f"{flag}/--no-{d.flag}"
        kwargs.update(default=default, show_default=False)
    elif s.kind is Kind.MANY:
        kwargs.update(multiple=True)
    elif s.kind is Kind.CHOICE:
        values = s.choices.values() if hasattr(s.choices, "values") else tuple(s.choices)
        kwargs.update(type=click.Choice(values), default=default,
                      show_default=s.show_default and default is not None)
    elif s.kind is Kind.SPLIT_AT:
        kwargs.update(type=SplitAt(), default=default)
    elif s.kind is Kind.PREFIX_CACHING:
        kwargs.update(type=PrefixCachingType(), default=prefix_caching_word(d.default),
                      is_flag=False, flag_value="on", show_default=True)
    else:
        kwargs.update(type=_TYPES.get(s.kind), default=default,
                      show_default=s.show_default and default is not None)
    if own is not None:             # (the command's help says its default)
        kwargs["show_default"] = False
    return click.option(*names, **kwargs)


def setting_option(name: str, help: str | None = None) -> Callable:
    """One declared setting's option (its flag, type, default, environment variable), for a
    command that takes it beside options of its own (plan, doctor, calibrate), with that
    command's help where it means something else there."""
    return _option_of(BY_NAME[name], help)


def settings_options(command: str) -> Callable:
    """Every declared setting `command` takes, group by group, as click options (decorator);
    `--no-prefix-caching` beside `--prefix-caching` (the same as off)."""
    options = []
    for d in DECLARED:
        if d.flag is None or command not in d.setting.commands:
            continue
        options.append(_option_of(d, command=command))
        if d.setting.kind is Kind.PREFIX_CACHING:
            options.append(click.option("--no-prefix-caching", is_flag=True, default=False,
                                        help="The same as --prefix-caching off."))

    def decorate(func):
        for option in reversed(options):
            func = option(func)
        return func
    return decorate


def declared_options(declared: tuple[Declared, ...], command: str) -> Callable:
    """The click options of a command's own declarations (plan's: settings/plan_options.py),
    in their order (decorator)."""
    options = [_option_of(d, command=command) for d in declared]

    def decorate(func):
        for option in reversed(options):
            func = option(func)
        return func
    return decorate


def sweep_values(options: dict, command: str) -> dict[str, list]:
    """The values of each setting bench may sweep (declared `sweep`), taken out of `options`:
    a list each; in any other command one value each (several: SettingsError naming bench)."""
    out = {}
    for d in DECLARED:
        if not d.setting.sweep or d.name not in options:
            continue
        text, flag = options.pop(d.name), f"--{d.flag}"
        values = (kv_reserve_list(text) if d.setting.kind is Kind.KV_RULE
                  else int_list(text, flag))
        if len(values) > 1 and command != "bench":
            raise SettingsError(f"{flag} takes one value in `{command}`; compare several with "
                                f"`neuron-batch bench {flag} {text}`")
        out[d.name] = values
    return out


def settings_from_options(inputs, options: dict, command: str = "run") -> RunSettings:
    """RunSettings from a command's parsed options (the declared ones it takes): bucket lists
    parsed, a swept setting's first value (bench sweeps the rest: `sweep_values` first), the
    instance priced on a Neuron host where --instance was given; validated, and the device
    checked before anything loads."""
    values = {name: vals[0] for name, vals in sweep_values(options, command).items()}
    for d in DECLARED:
        if d.name not in options:
            continue
        value = options[d.name]
        if d.setting.kind is Kind.BUCKETS:
            value = parse_buckets_option(value, f"--{d.flag}")
        elif d.setting.kind is Kind.MANY:
            value = tuple(value or ())
        elif d.setting.kind is Kind.PREFIX_CACHING:
            value = prefix_caching_option(value, options.get("no_prefix_caching", False))
        values[d.name] = value
    if values.get("device") != "sim" and _given("instance"):
        values["host_instance"] = values.get("instance")
    values["inputs"] = tuple(inputs) or (str(BUILTIN_PROMPTS),)
    settings = RunSettings.of(**values).validate()
    # Before any input, model or vLLM loads: say now if the device cannot work here.
    from neuron_batch.engine.engine import check_device_available

    check_device_available(settings.device)
    return settings


def _given(name: str) -> bool:
    """Whether option `name` was set by the user (command line, environment or job file), not
    left at its default."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return False
    source = ctx.get_parameter_source(name)
    return source is not None and source != click.core.ParameterSource.DEFAULT


def prefix_caching_option(value: bool | None, no_prefix_caching: bool) -> bool | None:
    """--prefix-caching VALUE and its alias --no-prefix-caching (off) as the setting; both
    given are refused, whatever they say, before anything runs."""
    if no_prefix_caching:
        if _given("prefix_caching"):
            raise SettingsError(f"--prefix-caching {prefix_caching_word(value)} and "
                                f"--no-prefix-caching together: give one (--no-prefix-caching "
                                f"is --prefix-caching off)")
        return False
    return value


class PrefixCachingType(click.ParamType):
    """--prefix-caching auto|on|off (bare: on, as the old flag); a job file's true/false too."""

    name = "auto|on|off"

    def convert(self, value, param, ctx):
        try:
            return parse_prefix_caching(value)
        except ValueError:
            self.fail(f"{value!r} is not one of {', '.join(PREFIX_CACHING)}", param, ctx)

    def get_metavar(self, param, ctx=None):
        return "[" + "|".join(PREFIX_CACHING) + "]"


def kv_reserve_list(text: str) -> list[str]:
    """--kv-reserve request,max-model-len -> ["request", "max_model_len"] (canonical names)."""
    try:
        values = [parse_kv_reserve(part) for part in str(text).split(",") if part.strip()]
    except ValueError as error:
        raise SettingsError(f"--{error}") from None
    if not values:
        raise SettingsError(f"--kv-reserve: no rule in {text!r}; use request or max-model-len")
    return list(dict.fromkeys(values))


def int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(part) for part in str(text).split(",") if part.strip()]
    except ValueError:
        raise SettingsError(f"{option}: {text!r} is not a whole number or a list like 8,16,32"
                            ) from None
    if not values or any(v <= 0 for v in values):
        raise SettingsError(f"{option} must be positive whole numbers, got {text!r}")
    return values


class SplitAt(click.ParamType):
    """--split-at: a number of tokens, or auto."""

    name = "split-at"

    def convert(self, value, param, ctx):
        if value is None or isinstance(value, int):
            return value
        text = str(value).strip().lower()
        if text == SPLIT_AUTO:
            return SPLIT_AUTO
        try:
            return int(text)
        except ValueError:
            self.fail(f"{value!r} is neither a number of tokens nor auto", param, ctx)
