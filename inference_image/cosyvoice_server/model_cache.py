"""The node-local model cache: `cosyvoice-server fetch --cache-dir` keeps each model once per node.

A cache directory (a hostPath or a PersistentVolumeClaim) holds one entry per model archive, named for
the archive's SHA-256 (`storage.sha256`, required for the cache):

    <cache>/sha256-<hex>/model/        the model directory, mounted read-only by the server (subPath)
    <cache>/sha256-<hex>/files.json    size and SHA-256 of every file in model/, written at fill
    <cache>/sha256-<hex>/last-used     its mtime is the entry's last use (eviction order)
    <cache>/.sha256-<hex>.lock         flock: one pod fills or checks an entry, the others wait for it

The first pod on a node fills the entry: the archive is downloaded and its digest checked as in a plain
fetch, unpacked into a staging folder inside the cache, every file hashed into files.json, and the
folder renamed into place (one rename: an entry is whole or absent). Every later pod re-hashes the
entry's files against files.json before it is used: a damaged or tampered entry (a file changed,
missing, added or truncated) is removed and fetched again, never served.

Eviction keeps the cache under `--cache-max-bytes`: after a fill, the least recently used entries go
first, except an entry in use (a server holds a shared flock on its model's fetch marker for its
lifetime), being filled or checked (its lock is held), or used within the last `--cache-min-idle-s`
(the gap between a pod's fetch step and its server taking the lock). When only such entries remain
the cache stays over the cap until the next fill.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from .startup import Phases

log = logging.getLogger(__name__)

ENTRY_PREFIX = "sha256-"
FILES = "files.json"
LAST_USED = "last-used"
MODEL = "model"
STAGING_PREFIX = ".fill-"
TRASH_PREFIX = ".evict-"
CHUNK = 1 << 20
DEFAULT_MAX_BYTES = 100 * 2**30
DEFAULT_MIN_IDLE_S = 600.0


class CacheError(Exception):
    """The cache directory cannot be used (not writable, not a directory); the message says why."""


def entry_name(sha256: str) -> str:
    """The entry of an archive: its digest, checked to be one (it becomes a path)."""
    digest = sha256.lower()
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise ValueError(f"not a SHA-256 digest: {sha256!r}")
    return ENTRY_PREFIX + digest


@dataclass(frozen=True)
class Entry:
    name: str
    bytes: int
    last_used: float  # seconds since the epoch
    busy: bool  # in use by a server, or being filled or checked


def choose_evictions(entries: list[Entry], max_bytes: int, now: float, min_idle_s: float) -> list[str]:
    """The entries to remove, least recently used first, until the total fits `max_bytes`; busy entries and
    those used within `min_idle_s` stay (and still count)."""
    total = sum(e.bytes for e in entries)
    chosen = []
    for e in sorted(entries, key=lambda e: (e.last_used, e.name)):
        if total <= max_bytes:
            break
        if e.busy or now - e.last_used < min_idle_s:
            continue
        chosen.append(e.name)
        total -= e.bytes
    return chosen


def file_digests(root: Path) -> dict[str, list]:
    """{relative path: [size, sha256]} of every regular file under `root`."""
    out = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        h = hashlib.sha256()
        with path.open("rb") as f:
            while block := f.read(CHUNK):
                h.update(block)
        out[path.relative_to(root).as_posix()] = [path.stat().st_size, h.hexdigest()]
    return out


def damage(entry: Path) -> str | None:
    """Why an entry cannot be served (None: every file is as it was filled)."""
    try:
        recorded = json.loads((entry / FILES).read_text())
    except (OSError, ValueError) as exc:
        return f"{FILES} unreadable ({exc.__class__.__name__})"
    model = entry / MODEL
    try:
        # sizes first: a truncated or missing file is found without hashing 2 GB
        present = {p.relative_to(model).as_posix(): p.stat().st_size for p in model.rglob("*") if p.is_file()}
        if present != {k: v[0] for k, v in recorded.items()}:
            changed = sorted(set(present.items()) ^ {(k, v[0]) for k, v in recorded.items()})
            return f"files missing, added or resized ({changed[0][0]}{' and more' if len(changed) > 1 else ''})"
        actual = file_digests(model)
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    bad = sorted(k for k in recorded if actual.get(k) != recorded[k])
    return f"content changed: {', '.join(bad[:3])}" if bad else None


@contextmanager
def _flock(path: Path, mode: int) -> Iterator[bool]:
    """Holds flock `mode` (LOCK_EX/LOCK_SH, | LOCK_NB to try) on `path`; yields whether it was taken."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o664)
    try:
        try:
            fcntl.flock(fd, mode)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def _in_use(model: Path) -> bool:
    """Whether a server holds its shared lock on this model (see hold_in_use)."""
    from .fetch import MARKER

    try:
        fd = os.open(model / MARKER, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing releases the probe's lock


def hold_in_use(model_dir: Path) -> int | None:
    """Called by the server: a shared lock on the model's fetch marker for the life of the process (the
    descriptor stays open), so eviction on this node leaves the model alone. None if there is no marker
    (a model from the image or a PVC)."""
    from .fetch import MARKER

    try:
        fd = os.open(model_dir / MARKER, os.O_RDONLY)
    except OSError:
        return None
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def _remove(cache: Path, entry: Path) -> None:
    """An entry out of sight at once (rename), then deleted."""
    trash = Path(tempfile.mkdtemp(prefix=TRASH_PREFIX, dir=cache))
    entry.rename(trash / entry.name)
    shutil.rmtree(trash, ignore_errors=True)


def _size(entry: Path) -> int:
    return sum(p.stat().st_size for p in entry.rglob("*") if p.is_file())


def evict(cache: Path, max_bytes: int, min_idle_s: float, now: float | None = None) -> list[str]:
    """Removes least recently used entries until the cache fits `max_bytes`; returns their names."""
    now = time.time() if now is None else now
    for leftover in cache.glob(TRASH_PREFIX + "*"):  # a removal cut off by SIGKILL
        shutil.rmtree(leftover, ignore_errors=True)
    entries = []
    with ExitStack() as stack:
        for d in sorted(cache.glob(ENTRY_PREFIX + "*")):
            if not d.is_dir():
                continue
            taken = stack.enter_context(_flock(cache / f".{d.name}.lock", fcntl.LOCK_EX | fcntl.LOCK_NB))
            try:
                last = (d / LAST_USED).stat().st_mtime
            except OSError:
                last = 0.0
            busy = not taken or _in_use(d / MODEL)
            entries.append(Entry(d.name, _size(d), last, busy))
        chosen = choose_evictions(entries, max_bytes, now, min_idle_s)
        for name in chosen:  # each still locked by this process: nobody starts using it meanwhile
            _remove(cache, cache / name)
            log.info("model cache: evicted %s (least recently used; cache over %d bytes)", name, max_bytes)
    return chosen


def _touch(entry: Path) -> None:
    (entry / LAST_USED).touch()
    os.utime(entry / LAST_USED)


def ensure(cache: Path, sha256: str, fill, phases: Phases, max_bytes: int, min_idle_s: float) -> Path:
    """The verified model directory of archive `sha256` in `cache`, filled by `fill(dest)` (a plain fetch into
    a new folder) when absent or damaged. Waits while another process fills or checks the same entry."""
    name = entry_name(sha256)
    entry = cache / name
    try:
        cache.mkdir(parents=True, exist_ok=True)
        lock = _flock(cache / f".{name}.lock", fcntl.LOCK_EX)
        lock.__enter__()
    except OSError as exc:
        raise CacheError(f"{cache}: cannot use the model cache: {exc.strerror or exc}") from None
    with ExitStack() as held:
        held.push(lock.__exit__)
        if entry.is_dir():
            with phases("cache_verify"):
                why = damage(entry)
            if why is None:
                _touch(entry)
                log.info("model cache: hit %s", name)
                return entry / MODEL
            log.warning("model cache: %s is damaged (%s); fetching it again", name, why)
            _remove(cache, entry)
        for old in cache.glob(f"{STAGING_PREFIX}{name}.*"):  # a fill cut off by SIGKILL (the lock is ours now)
            shutil.rmtree(old, ignore_errors=True)
        stage = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{name}.", dir=cache))
        try:
            fill(stage / MODEL)
            with phases("cache_fill"):
                (stage / FILES).write_text(json.dumps(file_digests(stage / MODEL)))
                _touch(stage)
                stage.chmod(0o755)  # mkdtemp's 0700 would hide the entry from a server running as another user
                stage.rename(entry)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        log.info("model cache: filled %s", name)
        evict(cache, max_bytes, min_idle_s)  # under this entry's lock: never the entry just filled
    return entry / MODEL
