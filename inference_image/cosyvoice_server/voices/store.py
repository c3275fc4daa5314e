"""Registered voices on a directory every replica mounts (a ReadWriteMany volume), plus a per-replica
LRU of their prompt tensors.

Layout under the store's root::

    voices/<name>/voice.npz    the prompt tensors (the format of a model's voices/ directory)
    voices/<name>/voice.json   what the API shows: mode, transcript, clip facts, model, creation time, owner,
                               and the record's schema version
    .staging/<random>/         a voice being written; renamed into voices/ only when complete
    .trash/<random>/           a deleted voice being removed

Every change is one rename(2), atomic on a local or network filesystem (NFS, CephFS, EFS): a voice is
either absent or complete, for every replica. Adding renames a finished directory onto voices/<name>,
which fails when that name exists, so two replicas registering one name at once get one voice and one
409, with no lock to leak if a process dies. Deleting renames the directory out of voices/ first.
Nothing is remembered between requests except the tensor cache, whose entries are checked against the
file's identity (inode, size, mtime) on each use: a voice added, replaced or deleted by another replica
is seen on the next request, without restarts or invalidation messages.

A record the store cannot read (a truncated or hand-edited `voice.json`, one written by a newer,
incompatible version during a rolling upgrade, a voice directory missing a file) is left out of the
listing and counted by reason in `unreadable`, logged once: one damaged voice never hides the others.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from ..engine.pipeline import Voice, load_voice, save_voice
from ..model.manifest import Manifest

log = logging.getLogger(__name__)

NAME_PATTERN = r"[a-z0-9][a-z0-9._-]{0,62}"
_NAME = re.compile(NAME_PATTERN)
TENSORS, METADATA = "voice.npz", "voice.json"
# Staging directories older than this were left by a process that died mid-write.
STALE_STAGING_S = 3600.0

Mode = Literal["zero_shot", "cross_lingual"]

# voice.json's layout. 1: no version key, no owner. 2: `owner`, and the two version keys below. A version that
# only adds fields keeps MIN_READER_VERSION, so older replicas read what they know of its records; one that
# changes a field's meaning raises it, and older replicas skip its records instead of misreading them.
SCHEMA_VERSION = 2
MIN_READER_VERSION = 2  # ownership must be honoured: a reader that ignores `owner` would let anyone delete
# Far above any record (a transcript is at most 2048 characters): a larger file is not one, and is not read whole.
MAX_RECORD_BYTES = 1 << 20
# Why a voice directory could not be read, as the metric's label and the log say it.
UNREADABLE_REASONS = ("invalid_json", "invalid_record", "newer_schema", "missing_tensors", "missing_metadata",
                      "unreadable")


def valid_name(name: str) -> bool:
    return _NAME.fullmatch(name) is not None


class VoiceExists(Exception):
    pass


class UnreadableRecord(Exception):
    """A voice directory whose record cannot be read; `reason` is one of UNREADABLE_REASONS."""

    def __init__(self, name: str, reason: str, detail: str) -> None:
        super().__init__(f"voice {name}: {detail}")
        self.name = name
        self.reason = reason
        self.detail = detail


class VoiceRecord(BaseModel):
    """A registered voice's metadata, as GET /v1/audio/voices/{name} shows it. Strict types: a record
    whose values are not what this version writes is damaged, not coerced; keys it does not know (from a
    newer, compatible version) are ignored."""

    model_config = ConfigDict(frozen=True, strict=True, extra="ignore")

    name: str
    mode: Mode
    transcript: str | None
    created_at: int
    model: str
    duration_seconds: float
    sample_rate: int
    samples: int
    format: str
    prompt_speech_tokens: int
    sha256: str  # of the uploaded file: which recording a voice came from, for audits and consent records
    # who registered it: an identity derived from the registration key (api/auth.py), never a key; None for a
    # voice registered before owners were recorded (schema 1), which only an admin may delete
    owner: str | None = None


def record_json(record: VoiceRecord) -> str:
    return json.dumps({"schema_version": SCHEMA_VERSION, "min_reader_version": MIN_READER_VERSION,
                       **record.model_dump()}, ensure_ascii=False, indent=1)


def parse_record(name: str, raw: bytes) -> VoiceRecord:
    """The record of the voice directory `name` from its voice.json's bytes; UnreadableRecord says why not."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UnreadableRecord(name, "invalid_json", f"{METADATA} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise UnreadableRecord(name, "invalid_record", f"{METADATA} is not a JSON object")
    version = data.get("schema_version", 1)
    needs = data.get("min_reader_version", version)
    if not all(type(v) is int and v >= 1 for v in (version, needs)):
        raise UnreadableRecord(name, "invalid_record", f"{METADATA} has an invalid schema_version or "
                               "min_reader_version")
    if needs > SCHEMA_VERSION:
        raise UnreadableRecord(name, "newer_schema", f"{METADATA} is schema version {version}, readable from "
                               f"version {needs}; this server reads up to {SCHEMA_VERSION} (a newer server wrote it)")
    try:
        record = VoiceRecord.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(x) for x in first["loc"]) or "record"
        raise UnreadableRecord(name, "invalid_record", f"{METADATA}: {field}: {first['msg']}") from None
    if record.name != name:
        raise UnreadableRecord(name, "invalid_record", f"{METADATA} names the voice {record.name!r}")
    return record


class VoiceStore:
    """`manifest`: the served model, which every voice read must fit (a voice from another model is refused).
    `writable` False: a replica that only serves voices, on a read-only mount that may still be empty."""

    def __init__(self, root: Path, manifest: Manifest, writable: bool = True) -> None:
        self.root = root
        self.manifest = manifest
        self.voices = root / "voices"
        self.staging = root / ".staging"
        self.trash = root / ".trash"
        # voice directories the last full listing could not read, by reason (a metric); the names logged
        self.unreadable: dict[str, int] = dict.fromkeys(UNREADABLE_REASONS, 0)
        self._logged: set[tuple[str, str]] = set()
        if writable:
            for d in (self.voices, self.staging, self.trash):
                d.mkdir(parents=True, exist_ok=True)
            self._sweep()
        elif not root.is_dir():
            raise FileNotFoundError(f"voice store {root} is not a directory")

    def _sweep(self) -> None:
        """Removes what a process that died mid-write or mid-delete left (never a voice in voices/)."""
        now = time.time()
        for parent, min_age in ((self.staging, STALE_STAGING_S), (self.trash, 0.0)):
            for entry in os.scandir(parent):
                try:
                    if now - entry.stat(follow_symlinks=False).st_mtime >= min_age:
                        shutil.rmtree(entry.path, ignore_errors=True)
                except FileNotFoundError:
                    pass  # another replica swept it

    def path(self, name: str) -> Path:
        if not valid_name(name):  # never a path outside voices/, whatever the caller checked
            raise ValueError(f"invalid voice name {name!r}")
        return self.voices / name

    def exists(self, name: str) -> bool:
        return valid_name(name) and (self.path(name) / TENSORS).is_file()

    def add(self, record: VoiceRecord, voice: Voice) -> None:
        """Writes the voice whole, then makes it visible in one rename; VoiceExists if the name is taken."""
        target = self.path(record.name)
        tmp = self.staging / uuid.uuid4().hex
        tmp.mkdir()
        try:
            save_voice(tmp / TENSORS, voice)
            (tmp / METADATA).write_text(record_json(record))
            for f in (TENSORS, METADATA):
                _fsync(tmp / f)
            _fsync(tmp)
            try:
                os.rename(tmp, target)  # fails on an existing, non-empty voices/<name>: no overwrite
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    raise VoiceExists(record.name) from None
                raise
            _fsync(self.voices)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # gone after a successful rename; a half-write otherwise

    def record(self, name: str) -> VoiceRecord | None:
        """The voice's record; None if there is no voice of that name; UnreadableRecord if it is damaged."""
        if not valid_name(name):
            return None
        d = self.path(name)
        try:
            with open(d / METADATA, "rb") as f:
                raw = f.read(MAX_RECORD_BYTES + 1)
        except (FileNotFoundError, NotADirectoryError):
            if (d / TENSORS).is_file():
                raise UnreadableRecord(name, "missing_metadata", f"{METADATA} is missing") from None
            return None  # no voice (or an empty directory, or one deleted meanwhile)
        except OSError as exc:
            raise UnreadableRecord(name, "unreadable", f"{METADATA}: {exc.strerror or exc}") from None
        if len(raw) > MAX_RECORD_BYTES:
            raise UnreadableRecord(name, "invalid_record", f"{METADATA} is over {MAX_RECORD_BYTES} bytes")
        record = parse_record(name, raw)
        if not (d / TENSORS).is_file():
            if not d.is_dir():
                return None  # deleted meanwhile
            raise UnreadableRecord(name, "missing_tensors", f"{TENSORS} is missing")
        return record

    def records(self) -> list[VoiceRecord]:
        """Every readable voice, by name; read from disk on each call, so it is the same on every replica.
        The others are counted in `unreadable` and logged (once per voice and reason)."""
        return self._scan()[0]

    def usage(self, owner: str | None) -> tuple[int, int]:
        """(voices in the store, readable or not; those of them `owner` registered): what the quotas count."""
        found, damaged = self._scan()
        return len(found) + len(damaged), sum(r.owner == owner for r in found)

    def _scan(self) -> tuple[list[VoiceRecord], list[UnreadableRecord]]:
        found, damaged = [], []
        for entry in sorted(self._entries(), key=lambda e: e.name):
            if not valid_name(entry.name):
                continue
            try:
                rec = self.record(entry.name)
            except UnreadableRecord as exc:
                damaged.append(exc)
                continue
            if rec is not None:
                found.append(rec)
        self._report(damaged)
        return found, damaged

    def _report(self, damaged: list[UnreadableRecord]) -> None:
        counts = Counter(exc.reason for exc in damaged)
        self.unreadable = {reason: counts[reason] for reason in UNREADABLE_REASONS}
        seen = {(exc.name, exc.reason) for exc in damaged}
        for exc in damaged:
            if (exc.name, exc.reason) not in self._logged:
                log.warning("voice store: %s; the voice is left out of the listing until it is repaired or deleted "
                            "(an admin key may DELETE it)", exc)
        self._logged = seen

    def count(self) -> float:
        """Voices in the store (NaN while it cannot be read: a metric, never an error)."""
        try:
            return sum(1 for e in self._entries() if valid_name(e.name))
        except OSError:
            return float("nan")

    def _entries(self) -> list[os.DirEntry]:
        try:
            return list(os.scandir(self.voices))
        except FileNotFoundError:  # nothing registered yet on a store no replica has written to
            return []

    def delete(self, name: str) -> bool:
        """Removes a voice; False if there was none. It disappears for every replica at the rename."""
        if not valid_name(name):
            return False
        gone = self.trash / uuid.uuid4().hex
        try:
            os.rename(self.path(name), gone)
        except FileNotFoundError:
            return False
        shutil.rmtree(gone, ignore_errors=True)
        return True

    def identity(self, name: str) -> tuple[int, int, int] | None:
        """What changes when the voice under a name is replaced: (inode, size, mtime); None if absent."""
        if not valid_name(name):
            return None
        try:
            st = os.stat(self.path(name) / TENSORS)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def load(self, name: str) -> Voice:
        return load_voice(self.path(name) / TENSORS, self.manifest, name)


class PromptCache:
    """Registered voices' tensors in memory, least recently used evicted first, bounded in bytes.

    `lookup` stats the voice's file on every call (one metadata round trip on a network volume) and
    serves the cached tensors only while the file is the one they were read from."""

    def __init__(self, store: VoiceStore, max_bytes: int,
                 on_lookup: Callable[[bool], None] = lambda hit: None) -> None:
        self.store = store
        self.max_bytes = max_bytes
        self.on_lookup = on_lookup
        self._entries: OrderedDict[str, tuple[tuple[int, int, int], Voice, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # lookups run in worker threads

    @property
    def bytes(self) -> int:
        return self._bytes

    def lookup(self, name: str) -> Voice | None:
        """The registered voice under `name`, None if there is none (blocking: call off the event loop)."""
        ident = self.store.identity(name)
        with self._lock:
            cached = self._entries.get(name)
            if cached is not None and cached[0] == ident:
                self._entries.move_to_end(name)
                self.on_lookup(True)
                return cached[1]
            if cached is not None:
                self._drop(name)
        if ident is None:
            return None
        self.on_lookup(False)
        try:
            voice = self.store.load(name)
        except FileNotFoundError:  # deleted between the stat and the read
            return None
        self._put(name, ident, voice)
        return voice

    def _put(self, name: str, ident: tuple[int, int, int], voice: Voice) -> None:
        size = voice.nbytes
        if size > self.max_bytes:
            return
        with self._lock:
            if name in self._entries:
                self._drop(name)
            self._entries[name] = (ident, voice, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                self._drop(next(iter(self._entries)))

    def _drop(self, name: str) -> None:
        _, _, size = self._entries.pop(name)
        self._bytes -= size


def _fsync(path: Path) -> None:
    """Flushes a file or directory entry, so a voice a client was told exists survives a node crash."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
