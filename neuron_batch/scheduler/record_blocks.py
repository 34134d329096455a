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


def _times(values: Sequence[float], width: int) -> bytes:
    """Row-major times (`width` a row), each XOR the time before it in that order, then split
    back into one column per field, each in byte planes."""
    chained = _xor_chain(values)
    return b"".join(_planes(chained[j::width]) for j in range(width))


def _from_times(raw: bytes, width: int) -> np.ndarray:
    n = len(raw) // 8 // width
    words: np.ndarray = np.empty(n * width, dtype=np.int64)
    for j in range(width):
        words[j::width] = _unplanes(raw[8 * n * j:8 * n * (j + 1)])
    return _unchain(words)


def encode(kind: str, columns: tuple[tuple[str, str], ...], records: Sequence[Any]) -> str:
    """One JSON line holding `records` (objects with the columns as attributes)."""
    sizes: list[int] = []
    parts: list[bytes] = []
    extra: list[str] = []
    extra_index: dict[str, int] = {}
    for name, type_ in columns:
        if type_ == "t":
            names = name.split()
            raw = _times([_NAN if v is None else v for r in records
                          for v in (getattr(r, n) for n in names)], len(names))
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
    line: dict[str, Any] = {"type": kind, "n": len(records), "codec": codec,
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
            names = name.split()
            values = _from_times(chunk, len(names))
            for i, field_name in enumerate(names):
                out[field_name] = values[i::len(names)]
        elif type_ == "c":
            table = _STEP_TABLES[name]
            out[name] = [None if c == 0 else table[c - 1] if c > 0 else extra[-1 - c]
                         for c in _from_ints(chunk).tolist()]
        else:
            ends = np.cumsum(_from_ints(chunk[:8 * n])).tolist()
            text = chunk[8 * n:]
            out[name] = [text[a:b].decode("utf-8") for a, b in zip([0, *ends], ends)]
    return out


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
