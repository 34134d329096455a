"""Job files (`--config job.toml`): a run's options as TOML, read into setting names, with the
line of an unknown key and the option it was probably meant to be."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from neuron_batch.errors import did_you_mean
from neuron_batch.settings.run_settings import DECLARED, SettingsError


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a job file (TOML). Keys are the declared settings' option names, with dashes or
    underscores; a setting declared in a table (the simulated target's [sim]) may be given in
    it or at the top. Returns setting name (the option's click parameter: `dataset_split` for
    `split`) -> value."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        data = tomllib.loads(text)
    except FileNotFoundError:
        raise SettingsError(f"{path}: no such config file") from None
    except tomllib.TOMLDecodeError as error:
        raise SettingsError(f"{path}: not valid TOML: {error}") from None
    by_key = {d.key: d.name for d in DECLARED if d.setting.in_job_file}
    tables = {d.setting.table for d in DECLARED if d.setting.table}
    flat: dict[str, Any] = {}
    written: dict[str, tuple[str | None, str]] = {}  # flat key -> (its table, key as written)
    for key, value in data.items():
        table = key in tables and isinstance(value, dict)  # its keys are flat settings too
        for name, item in (value.items() if table else [(key, value)]):
            flat[name.replace("-", "_")] = item
            written[name.replace("-", "_")] = (key if table else None, name)
    unknown = [k for k in flat if k not in by_key]
    if unknown:
        raise SettingsError("; ".join(_unknown_key(path, text, *written[k], set(by_key))
                                      for k in unknown))
    return {by_key[key]: value for key, value in flat.items()}


def _unknown_key(path: Path, text: str, table: str | None, key: str, known: set[str]) -> str:
    """"job.toml:3: unknown setting 'max-num-seq'; did you mean 'max-num-seqs'?", the names
    spelt with dashes or underscores as the key is; the known names when none is close.
    tomllib keeps no positions: the line is the first `key =` under the key's table."""
    dashes = "-" in key or "_" not in key
    names = sorted(name.replace("_", "-") if dashes else name for name in known)
    current, where = None, str(path)
    setting = re.compile(rf"""\s*(["']?){re.escape(key)}\1\s*=""")
    for number, line in enumerate(text.splitlines(), 1):
        if header := re.match(r"""\s*\[\s*["']?([^\]"']+)["']?\s*\]""", line):
            current = header.group(1).strip()
        elif current == table and setting.match(line):
            where = f"{path}:{number}"
            break
    return f"{where}: unknown setting {key!r}" + (did_you_mean(key, names)
                                                  or f"; known: {', '.join(names)}")
