"""Bytes to and from one S3 bucket through a botocore client: a range of a file put as one
object (in parts above CHUNK), a file extended in place (its first bytes copied within the
store, only the new ones sent), keys deleted a thousand at a time, listed, read into a file.
What the run folder's mirror (run_bucket.py) and `report s3://` use; nothing here knows a run
folder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

CHUNK = 64 << 20        # one PUT up to this; a multipart upload of such parts above it
_COPY_PART = 4 << 30    # a part copied within the store (S3's most: 5 GiB)


class BucketObjects:
    def __init__(self, client: Any, bucket: str):
        self.client, self.bucket = client, bucket

    def put_bytes(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data)

    def put_file(self, key: str, path: Path, start: int, end: int) -> None:
        """`key` as bytes [start, end) of `path`."""
        if end - start <= CHUNK:
            with open(path, "rb") as handle:
                handle.seek(start)
                self.put_bytes(key, handle.read(end - start))
            return
        self._multipart(key, path, start, end)

    def append_file(self, key: str, path: Path, held: int, end: int) -> None:
        """`key` made the first `end` bytes of `path` from the `held` it has (a prefix of
        them) and the bytes after: a multipart upload whose first parts are copied within the
        store, so a records file of a long run costs only what it grew by, not its size,
        each sync. (S3 wants every part but the last of 5 MiB or more: only then.)"""
        if end == held:
            return
        self._multipart(key, path, held, end, copied=held)

    def _multipart(self, key: str, path: Path, start: int, end: int, copied: int = 0) -> None:
        """`key` as bytes [start, end) of `path`, after the first `copied` bytes of the
        object `key` is now (copied in the store)."""
        client, bucket = self.client, self.bucket
        with open(path, "rb") as handle:
            handle.seek(start)
            upload = client.create_multipart_upload(Bucket=bucket, Key=key)
            done: list[dict[str, Any]] = []
            try:
                # (equal copied parts: each of them 5 MiB or more, as S3 wants)
                pieces = -(-copied // _COPY_PART)
                size = -(-copied // pieces) if copied else 1
                for first in range(0, copied, size):
                    last = min(copied, first + size) - 1
                    answer = client.upload_part_copy(
                        Bucket=bucket, Key=key, UploadId=upload["UploadId"],
                        PartNumber=len(done) + 1, CopySource={"Bucket": bucket, "Key": key},
                        CopySourceRange=f"bytes={first}-{last}")
                    done.append({"PartNumber": len(done) + 1,
                                 "ETag": answer["CopyPartResult"]["ETag"]})
                position = start
                while position < end:
                    data = handle.read(min(CHUNK, end - position))
                    answer = client.upload_part(
                        Bucket=bucket, Key=key, UploadId=upload["UploadId"],
                        PartNumber=len(done) + 1, Body=data)
                    done.append({"PartNumber": len(done) + 1, "ETag": answer["ETag"]})
                    position += len(data)
                client.complete_multipart_upload(
                    Bucket=bucket, Key=key, UploadId=upload["UploadId"],
                    MultipartUpload={"Parts": done})
            except BaseException:
                client.abort_multipart_upload(Bucket=bucket, Key=key,
                                              UploadId=upload["UploadId"])
                raise

    def delete(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):
            batch = keys[start:start + 1000]
            if batch:
                self.client.delete_objects(Bucket=self.bucket, Delete={
                    "Objects": [{"Key": key} for key in batch], "Quiet": True})

    def listing(self, prefix: str) -> Iterator[tuple[str, int]]:
        """(key relative to `prefix`, size) of every object under it."""
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix)
        for page in pages:
            for item in page.get("Contents", []):
                yield item["Key"][len(prefix):], int(item["Size"])

    def download(self, key: str, target: Path) -> None:
        with open(target, "wb") as out:
            self.copy_into(key, out)

    def copy_into(self, key: str, out: IO[bytes]) -> int:
        """`key`'s bytes appended to `out`, a MiB at a time; how many."""
        body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
        copied = 0
        for chunk in iter(lambda: body.read(1 << 20), b""):
            out.write(chunk)
            copied += len(chunk)
        return copied
