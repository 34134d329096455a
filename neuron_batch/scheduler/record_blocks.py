"""The compact form of step and request records on disk: blocks of records as columns, packed,
compressed and written as one JSON line each (`{"type": "steps" | "requests", "n": ...,
"data": ...}`). Pure (bz2, base64, numpy).

Why this form (docs/development.md, "Records on disk"): a records file must stay a stream of
JSON lines, because a `--replicas` actor tails it and ships its lines to the driver, which
writes them into the run folder (replicas/actor.py, results.py) and a file cut short by a kill
must read up to its last whole line. Within a line, a block of records is stored by column:
integers as differences from the record before (a decode step's counters barely move),
floats as their bits XOR the value before (neighbouring times share their high bits), every
column's bytes split into byte planes (so those zero bytes run together), then bz2 and base85
(a quarter more than binary). bz2 over zlib: a quarter fewer bytes on the simulated
runs' blocks (scripts/bench_records.py) for about 10 us a step, once per block; a small block
(a replica's batch) takes zlib where that is smaller (`codec` says which). Step
records leave out their request ids (no reader needs them; they are most of a JSON step line).

Columns are named in the block's `cols`, so a later version may add one and an older reader
skips what it does not know; a column a block lacks reads as its default.
"""

from __future__ import annotations

import base64
import bz2
import json
import math
import struct
import zlib
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

# (mypy reads numpy's stubs only in part here, its submodules skipped (pyproject.toml), so most
# of its results are Any: hence the casts below to the array or bytes each operation gives)

#: Codes of the few strings a step column holds (index + 1; 0 is None).
STATES = ("IDLE", "ACTIVE_PREFILL", "ACTIVE_DECODE")
KINDS = ("prefill", "decode", "empty")
BLOCKED = ("at_capacity", "prefill_in_running", "prefill_batch_full", "kv_saturated")

#: Step columns: (field, type). "i" an integer, "n" an integer or None (stored + 1, 0 None),
#: "f" a float, "c" a string from a table (unknown strings: the block's `extra` list), "t"
#: several time fields (names split by spaces; None: NaN) stored row by row in one float
#: column, so each XORs the time just before it (a step's end its start, the next step's
#: start its end: on a virtual clock those are equal, and cost nothing). "p" a prefill step's
#: request ids (a decode step's are left out: max_num_seqs ids a step would be most of the
#: file; a prefill's few say which request a graph call served, which the prefix-cache and
#: optimum-neuron tests read).
STEP_COLUMNS: tuple[tuple[str, str], ...] = (
    ("step", "i"), ("state", "c"), ("kind", "c"), ("num_tokens", "i"),
    ("num_tokens_padded", "i"), ("num_seqs", "i"), ("num_seqs_padded", "i"), ("bucket", "n"),
    ("context_tokens", "i"), ("blocked", "c"), ("num_waiting", "i"), ("num_running", "i"),
    ("kv_usage", "f"), ("t_start t_end", "t"), ("kv_reserved_blocks", "i"),
    ("num_preempted", "i"), ("attended_len", "n"), ("longest_len", "n"),
    ("cached_tokens", "i"), ("recomputed_tokens", "i"), ("prefix_bucket", "n"),
    ("sampling_s", "f"), ("req_ids", "p"),
)
_STEP_TABLES = {"state": STATES, "kind": KINDS, "blocked": BLOCKED}

#: Request columns; "s" a string column (`req_id`, `finish_reason`, `sample_of`: None is "").
REQUEST_COLUMNS: tuple[tuple[str, str], ...] = (
    ("req_id", "s"), ("num_prompt_tokens", "i"), ("arrival", "t"), ("admitted", "t"),
    ("first_token", "t"), ("finished", "t"), ("num_output_tokens", "i"),
    ("num_cached_tokens", "i"), ("finish_reason", "s"), ("constrained", "i"),
    ("logprobs", "i"), ("sample_of", "s"),
)

_NAN = float("nan")
_DOUBLE, _WORD = struct.Struct("<d"), struct.Struct("<q")


def _bits_of(value: float) -> int:
    return cast(int, _WORD.unpack(_DOUBLE.pack(value))[0])


def _float_of(word: int) -> float:
    return cast(float, _DOUBLE.unpack(_WORD.pack(word))[0])

_SEP = "\x1f"     # (between a prefill step's request ids: a unit separator no id holds)


def _planes(words: np.ndarray) -> bytes:
    """64-bit words (little-endian) as their byte planes: every word's lowest byte, then
    every word's next byte, ..."""
    return cast(bytes, words.astype("<i8").view(np.uint8).reshape(-1, 8).T.tobytes())


def _unplanes(raw: bytes) -> np.ndarray:
    planes = np.frombuffer(raw, dtype=np.uint8).reshape(8, -1)
    return cast(np.ndarray, np.ascontiguousarray(planes.T).view("<i8").reshape(-1).astype(np.int64))


def _ints(values: Sequence[int]) -> bytes:
    words = np.asarray(values, dtype=np.int64)
    return _planes(np.diff(words, prepend=0))


def _from_ints(raw: bytes) -> np.ndarray:
    return cast(np.ndarray, np.cumsum(_unplanes(raw)))


def _xor_chain(values: Sequence[float]) -> np.ndarray:
    # Each float's bits XOR the one's before (as Gorilla does): neighbouring times share their
    # sign, exponent and high mantissa bits, which become zero bytes. Lossless.
    bits = np.asarray(values, dtype=np.float64).view(np.int64)
    return cast(np.ndarray,
                np.bitwise_xor(bits, np.concatenate(([0], bits[:-1]))) if len(bits) else bits)


def _unchain(words: np.ndarray) -> np.ndarray:
    if not len(words):
        return np.zeros(0)
    return cast(np.ndarray, np.bitwise_xor.accumulate(words).view(np.float64))


def _floats(values: Sequence[float]) -> bytes:
    return _planes(_xor_chain(values))


def _from_floats(raw: bytes) -> np.ndarray:
    return _unchain(_unplanes(raw))


#: A time column whose span is predicted from the last row of the same shape, and the columns
#: that make the shape: a simulated step lasts what its compiled shape costs (on a 5k-request
#: run, 99.8% of steps last, to the bit, what the last step of their shape lasted; 77% what the
#: step just before lasted).
_SPAN_KEYS = {"t_start t_end": ("kind", "bucket", "num_seqs_padded", "attended_len")}


class _Guess:
    """The prediction of each time of a block from the times before it (row-major, `width` a
    row): a row's first field, the time just before it (a step starts where the one before
    ended); each later field, the field before it plus the span the last row of the same key
    (shape) had there. Where there is none, or the sum is not finite (a None), the time just
    before. Encoder and decoder walk the same times, so a block's prediction is exact."""

    def __init__(self, width: int, keys: Sequence[Any] | None):
        self.width, self.keys = width, keys
        self.spans: dict[tuple[Any, int], float] = {}
        self.previous = 0.0

    def at(self, k: int) -> float:
        row, j = divmod(k, self.width)
        if j:
            span = self.spans.get((self.keys[row] if self.keys else None, j))
            if span is not None and math.isfinite(self.previous + span):
                return self.previous + span
        return self.previous

    def saw(self, k: int, value: float) -> None:
        row, j = divmod(k, self.width)
        if j:
            self.spans[(self.keys[row] if self.keys else None, j)] = value - self.previous
        self.previous = value


def _times(values: Sequence[float], width: int, keys: Sequence[Any] | None = None) -> bytes:
    """Row-major times (`width` a row), each as its bits XOR its prediction's (`_Guess`: zero
    where it is right, the low bytes only where it is close), split back into one column per
    field, each in byte planes. Lossless."""
    guess = _Guess(width, keys)
    guesses = []
    for k, value in enumerate(values):
        guesses.append(guess.at(k))
        guess.saw(k, value)
    words = (np.asarray(values, dtype=np.float64).view(np.int64)
             ^ np.asarray(guesses, dtype=np.float64).view(np.int64))
    return b"".join(_planes(words[j::width]) for j in range(width))


def _from_times(raw: bytes, width: int, predicted: bool,
                keys: Sequence[Any] | None = None) -> np.ndarray:
    n = len(raw) // 8 // width
    words: np.ndarray = np.empty(n * width, dtype=np.int64)
    for j in range(width):
        words[j::width] = _unplanes(raw[8 * n * j:8 * n * (j + 1)])
    if not predicted or width == 1:     # (each XOR the time before: a block written before
        return _unchain(words)          # 2026-12-05, or one field a row, which predicts so)
    # One time at a time: each prediction needs the times before it. (Only a full read of the
    # steps comes here, not the report: ~1 s a million steps.)
    guess = _Guess(width, keys)
    out = [0.0] * len(words)
    for k, word in enumerate(words.tolist()):
        value = out[k] = _float_of(word ^ _bits_of(guess.at(k)))
        guess.saw(k, value)
    return cast(np.ndarray, np.asarray(out, dtype=np.float64))


def encode(kind: str, columns: tuple[tuple[str, str], ...], records: Sequence[Any]) -> str:
    """One JSON line holding `records` (objects with the columns as attributes)."""
    sizes: list[int] = []
    parts: list[bytes] = []
    extra: list[str] = []
    extra_index: dict[str, int] = {}
    for name, type_ in columns:
        if type_ == "t":
            names = name.split()
            keys = ([tuple(getattr(r, key) for key in _SPAN_KEYS[name]) for r in records]
                    if name in _SPAN_KEYS else None)
            raw = _times([_NAN if v is None else v for r in records
                          for v in (getattr(r, n) for n in names)], len(names), keys)
            sizes.append(len(raw))
            parts.append(raw)
            continue
        values = [getattr(r, name) for r in records]
        if type_ == "i":
            raw = _ints([int(v) for v in values])
        elif type_ == "n":
            raw = _ints([0 if v is None else int(v) + 1 for v in values])
        elif type_ == "f":
            raw = _floats(values)
        elif type_ == "c":
            table = _STEP_TABLES[name]
            codes = []
            for v in values:
                if v is None:
                    codes.append(0)
                elif v in table:
                    codes.append(table.index(v) + 1)
                else:   # a string the table does not know (a newer state, reason): kept
                    if v not in extra_index:
                        extra_index[v] = len(extra)
                        extra.append(v)
                    codes.append(-1 - extra_index[v])
            raw = _ints(codes)
        else:           # "s", "p": lengths, then the UTF-8 text
            if type_ == "p":
                values = [_SEP.join(map(str, v or ())) if r.kind == "prefill" else ""
                          for r, v in zip(records, values)]
            texts = [("" if v is None else str(v)).encode("utf-8") for v in values]
            raw = _ints([len(t) for t in texts]) + b"".join(texts)
        sizes.append(len(raw))
        parts.append(raw)
    raw = b"".join(parts)
    codec, packed = "bz2", bz2.compress(raw, 9)
    if len(raw) < 65536:     # (a small block, a replica's batch: zlib's lesser overhead may win)
        small = zlib.compress(raw, 9)
        if len(small) < len(packed):
            codec, packed = "zlib", small
    line: dict[str, Any] = {"type": kind, "n": len(records), "codec": codec, "tp": 1,
                            "cols": [n for n, _ in columns], "sizes": sizes,
                            "data": base64.b85encode(packed).decode("ascii")}
    if extra:
        line["extra"] = extra
    return json.dumps(line, separators=(",", ":"))


def decode(line: dict[str, Any], columns: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """A block line (parsed) -> {field: values}: numpy arrays of integers (int64) and floats
    (times: NaN for None), lists of strings or None for the code and string columns. A column
    the block lacks is absent."""
    n = int(line["n"])
    packed = base64.b85decode(line["data"])
    raw = zlib.decompress(packed) if line.get("codec") == "zlib" else bz2.decompress(packed)
    types = dict(columns)
    extra = line.get("extra") or []
    out: dict[str, Any] = {}
    times: list[tuple[str, bytes]] = []     # (decoded last: their keys are other columns)
    offset = 0
    for name, size in zip(line["cols"], line["sizes"]):
        chunk = raw[offset:offset + size]
        offset += size
        type_ = types.get(name)
        if type_ is None:
            continue    # a column of a later version
        if type_ in ("i", "n"):
            out[name] = _from_ints(chunk)
        elif type_ == "f":
            out[name] = _from_floats(chunk)
        elif type_ == "t":
            times.append((name, chunk))
        elif type_ == "c":
            table = _STEP_TABLES[name]
            out[name] = [None if c == 0 else table[c - 1] if c > 0 else extra[-1 - c]
                         for c in _from_ints(chunk).tolist()]
        else:
            ends = np.cumsum(_from_ints(chunk[:8 * n])).tolist()
            text = chunk[8 * n:]
            out[name] = [text[a:b].decode("utf-8") for a, b in zip([0, *ends], ends)]
    for name, chunk in times:
        names = name.split()
        keys = _keys(out, _SPAN_KEYS[name], types, n) if name in _SPAN_KEYS else None
        values = _from_times(chunk, len(names), bool(line.get("tp")), keys)
        for i, field_name in enumerate(names):
            out[field_name] = values[i::len(names)]
    return out


def _keys(decoded: dict[str, Any], names: Sequence[str], types: dict[str, str],
          n: int) -> list[tuple[Any, ...]]:
    """Each row's key from decoded columns, as the records held them (None restored)."""
    columns = []
    for name in names:
        values = decoded.get(name)
        if values is None:
            columns.append([None] * n)
        elif types[name] == "n":
            columns.append([None if v == 0 else v - 1 for v in values.tolist()])
        elif isinstance(values, np.ndarray):
            columns.append(values.tolist())
        else:
            columns.append(values)
    return list(zip(*columns))


def rows(line: dict[str, Any], columns: tuple[tuple[str, str], ...],
         defaults: dict[str, Any]) -> list[dict[str, Any]]:
    """A block line -> one dict per record, None restored, absent columns at `defaults`."""
    decoded = decode(line, columns)
    n = int(line["n"])
    out: list[dict[str, Any]] = [{} for _ in range(n)]
    fields = [(f, "g") for name, type_ in columns if type_ == "t" for f in name.split()]
    fields += [(name, type_) for name, type_ in columns if type_ != "t"]
    for name, type_ in fields:
        values = decoded.get(name)
        if values is None:
            if name in defaults:
                for row in out:
                    row[name] = defaults[name]
            continue
        if isinstance(values, np.ndarray):
            values = values.tolist()
        if type_ == "n":
            values = [None if v == 0 else v - 1 for v in values]
        elif type_ == "g":
            values = [None if v != v else v for v in values]
        elif type_ == "p":
            values = [v.split(_SEP) if v else [] for v in values]
        elif type_ == "s" and name != "req_id":
            values = [v or None for v in values]
        elif type_ == "i" and name in ("constrained", "logprobs"):
            values = [bool(v) for v in values]
        for row, value in zip(out, values):
            row[name] = value
    return out
