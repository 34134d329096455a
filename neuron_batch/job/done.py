"""Which requests of a job have their output line: a bit per request, by its index in the job
(`PromptRecord.index`, the index outputs.index names it by), so that knowing what is done costs
an eighth of a byte a request, not a string (~100 bytes each in a set: 1 GB at 10M). A line
whose request no index names (read from outputs.jsonl without the job's ids) is kept by id.
Pure Python."""

from __future__ import annotations

from collections.abc import Iterator, Sequence


class DoneRequests:
    def __init__(self) -> None:
        self._bits = bytearray()
        self._ids: set[str] = set()     # (only lines no job index names: none, usually)
        self._count = 0

    def add(self, index: int | None, request_id: str) -> None:
        """The request at job `index` (None: not known) with id `request_id` is done."""
        if index is None:
            if request_id not in self._ids:
                self._ids.add(request_id)
                self._count += 1
            return
        byte, bit = divmod(index, 8)
        if byte >= len(self._bits):
            # (grown by half again: appending as a job finishes stays linear)
            self._bits.extend(bytes(max(byte + 1 - len(self._bits), len(self._bits) // 2)))
        if not self._bits[byte] >> bit & 1:
            self._bits[byte] |= 1 << bit
            self._count += 1

    def has(self, index: int | None, request_id: str | None = None) -> bool:
        """Whether the request at job `index` is done (or, where `by_id`, its id)."""
        if index is not None:
            byte, bit = divmod(index, 8)
            if byte < len(self._bits) and self._bits[byte] >> bit & 1:
                return True
        return request_id is not None and request_id in self._ids

    @property
    def by_id(self) -> bool:
        """Whether some done request is known by its id alone (so `has` needs the id too)."""
        return bool(self._ids)

    @property
    def by_id_ids(self) -> set[str]:
        """The ids of the done requests no index names."""
        return self._ids

    @property
    def bits(self) -> bytearray:
        """The done indices' bits: index i's is bit i % 8 of byte i // 8 (little-endian)."""
        return self._bits

    def __len__(self) -> int:
        return self._count

    def indices(self) -> Iterator[int]:
        for byte, value in enumerate(self._bits):
            if value:
                for bit in range(8):
                    if value >> bit & 1:
                        yield byte * 8 + bit

    def ids_in(self, ids_by_index: Sequence[str | None]) -> set[str]:
        """The done requests' ids (`ids_by_index`: the job's ids at their index), as a set: for
        a small job's checks (the replicas' report hashes them instead, report/replicas.py
        `DoneIds`)."""
        out = set(self._ids)
        out.update(rid for index in self.indices() if index < len(ids_by_index)
                   and (rid := ids_by_index[index]) is not None)
        return out

    def clear(self) -> None:
        self._bits.clear()
        self._ids.clear()
        self._count = 0
