"""One self-describing file per snapshot:

    magic (16 bytes) | version u16 | header length u32 | header crc32 u32 | manifest JSON | payload

all integers big-endian. The payload is the compacted LMDB ``data.mdb`` of the state machine; the
manifest (manifest.py) gives its size and sha256. The header has its own CRC because a flipped
digit in the manifest (say, the index) would otherwise pass the payload checksum and silently
mislabel the state. The version sits in the fixed part so a reader can refuse a newer format
before trying to parse a manifest it may not understand.

Payloads can be gigabytes: everything here streams in BLOCK_SIZE blocks, never reading a payload
into memory whole.
"""
from __future__ import annotations

import hashlib
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from snapshot.errors import SnapshotCorruptError
from snapshot.manifest import FORMAT_VERSION, SnapshotManifest

MAGIC = b"RAFTKV-SNAPSHOT\n"
_FIXED = struct.Struct(">HII")  # version, header length, header crc32
PREFIX_SIZE = len(MAGIC) + _FIXED.size
# A manifest is a few hundred bytes; anything this large is damage, not a big cluster.
MAX_HEADER_BYTES = 1 << 20
BLOCK_SIZE = 1 << 20


def encode_header(manifest: SnapshotManifest) -> bytes:
    header = manifest.to_json()
    return MAGIC + _FIXED.pack(manifest.format_version, len(header), zlib.crc32(header)) + header


def parse_header(buf: bytes, name: str) -> tuple[SnapshotManifest, int] | None:
    """Parse the manifest from the first bytes of a snapshot. Returns (manifest, payload offset),
    or None while `buf` is a valid but incomplete start (a stream still arriving). Raises
    SnapshotCorruptError as soon as the bytes cannot be a snapshot this build reads."""
    head = buf[:len(MAGIC)]
    if head != MAGIC[:len(head)]:
        raise SnapshotCorruptError(f"{name}: not a raftkv snapshot (it does not start with the snapshot magic)")
    if len(buf) < PREFIX_SIZE:
        return None
    version, header_len, header_crc = _FIXED.unpack_from(buf, len(MAGIC))
    if version != FORMAT_VERSION:
        raise SnapshotCorruptError(
            f"{name}: unsupported snapshot format version {version} (this build reads version {FORMAT_VERSION}); "
            "use the raftkv release that wrote it")
    if header_len > MAX_HEADER_BYTES:
        raise SnapshotCorruptError(f"{name}: damaged header (manifest length {header_len} bytes is implausible)")
    end = PREFIX_SIZE + header_len
    if len(buf) < end:
        return None
    header = bytes(buf[PREFIX_SIZE:end])
    if zlib.crc32(header) != header_crc:
        raise SnapshotCorruptError(f"{name}: damaged header (manifest checksum mismatch)")
    try:
        manifest = SnapshotManifest.from_json(header)
    except ValueError as exc:
        raise SnapshotCorruptError(f"{name}: damaged header ({exc})") from None
    if manifest.format_version != version:
        raise SnapshotCorruptError(
            f"{name}: damaged header (manifest says version {manifest.format_version}, header says {version})")
    return manifest, end


def read_manifest(path: str | os.PathLike[str]) -> tuple[SnapshotManifest, int]:
    """Read and check the header and the file's length, without hashing the payload (cheap).
    Returns (manifest, payload offset)."""
    path = Path(path)
    with open(path, "rb") as f:
        manifest, offset = _read_header(f, path)
        actual = os.fstat(f.fileno()).st_size
    _check_length(path, manifest, offset, actual)
    return manifest, offset


def read_header(path: str | os.PathLike[str]) -> tuple[SnapshotManifest, int]:
    """Only the header: (manifest, payload offset), even if the payload is short or damaged (for
    `inspect`, which reports such a file instead of refusing to describe it)."""
    path = Path(path)
    with open(path, "rb") as f:
        return _read_header(f, path)


def verify(path: str | os.PathLike[str]) -> SnapshotManifest:
    """Fully check a snapshot file: header, length and the payload's sha256."""
    return _read_payload(path, None)


def copy_payload(path: str | os.PathLike[str], out: BinaryIO) -> SnapshotManifest:
    """Stream the payload into `out` while verifying it, in one pass. On SnapshotCorruptError the
    caller must discard what was written to `out`."""
    return _read_payload(path, out)


def _read_payload(path: str | os.PathLike[str], out: BinaryIO | None) -> SnapshotManifest:
    """Read the whole payload, checking its sha256 against the manifest, copying it into `out`."""
    manifest, offset = read_manifest(path)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(offset)
        for block in _blocks(f, manifest.size):
            digest.update(block)
            if out is not None:
                out.write(block)
    _check_digest(Path(path), manifest, digest.hexdigest())
    return manifest


def payload_digest(payload: str | os.PathLike[str]) -> tuple[int, str]:
    """(size, hex sha256) of a payload file, for building its manifest."""
    digest = hashlib.sha256()
    size = 0
    with open(payload, "rb") as f:
        while block := f.read(BLOCK_SIZE):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def write_snapshot(out: BinaryIO, manifest: SnapshotManifest, payload: str | os.PathLike[str]) -> None:
    """Write header and payload to `out` (the caller fsyncs and renames). Raises
    SnapshotCorruptError if the payload no longer matches the manifest's size."""
    out.write(encode_header(manifest))
    with open(payload, "rb") as f:
        copied = 0
        while block := f.read(BLOCK_SIZE):
            out.write(block)
            copied += len(block)
    if copied != manifest.size:
        raise SnapshotCorruptError(f"{payload}: payload changed while being written ({copied} bytes, manifest says {manifest.size})")


def check_complete(name: str, manifest: SnapshotManifest, offset: int, total: int, payload_sha256: str) -> None:
    """The checks `verify` makes, for a file whose bytes were hashed as they arrived (transfer)."""
    _check_length(name, manifest, offset, total)
    _check_digest(name, manifest, payload_sha256)


def _read_header(f: BinaryIO, path: Path) -> tuple[SnapshotManifest, int]:
    buf = f.read(PREFIX_SIZE)
    parsed = parse_header(buf, str(path))
    if parsed is None and len(buf) == PREFIX_SIZE:
        _, header_len, _ = _FIXED.unpack_from(buf, len(MAGIC))
        buf += f.read(header_len)
        parsed = parse_header(buf, str(path))
    if parsed is None:
        raise SnapshotCorruptError(f"{path}: truncated (the file ends inside the header, after {len(buf)} bytes)")
    return parsed


def _check_length(name: str | Path, manifest: SnapshotManifest, offset: int, actual: int) -> None:
    expected = offset + manifest.size
    if actual < expected:
        raise SnapshotCorruptError(
            f"{name}: truncated (payload has {actual - offset} of {manifest.size} bytes)")
    if actual > expected:
        raise SnapshotCorruptError(f"{name}: damaged ({actual - expected} unexpected bytes after the payload)")


def _check_digest(name: str | Path, manifest: SnapshotManifest, actual: str) -> None:
    if actual != manifest.sha256:
        raise SnapshotCorruptError(
            f"{name}: checksum mismatch (payload sha256 {actual}, manifest says {manifest.sha256})")


def _blocks(f: BinaryIO, size: int) -> Iterator[bytes]:
    remaining = size
    while remaining:
        block = f.read(min(BLOCK_SIZE, remaining))
        if not block:
            raise SnapshotCorruptError(f"{f.name}: truncated while reading the payload")
        remaining -= len(block)
        yield block
