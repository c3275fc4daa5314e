"""`cosyvoice-server fetch`: puts a model directory in place before the server starts.

The operator runs it in an init container for `storageUri`, as a non-root user on a read-only root
filesystem where only `--dest` (and /tmp) can be written. Sources: a local path or file:// URI (a
directory or an archive), http(s)://, s3:// (boto3; AWS_* variables, AWS_ENDPOINT_URL for S3-compatible
stores) and gs:// (google-cloud-storage; GOOGLE_APPLICATION_CREDENTIALS, anonymous for public buckets).

Everything happens in a staging folder inside `--dest`: the download (its SHA-256 checked when given),
the unpacking of .tar[.gz|.bz2|.xz] or .zip archives (regular files and folders only: no links, devices,
absolute or `..` paths), then a check of model.yaml. Only then are the model's files renamed into
`--dest` (model.yaml last, so a cut-off commit is never a loadable model). Total bytes, unpacked bytes and
file count are capped, one deadline covers the whole run, and any failure, SIGTERM included, removes
the staging folder and ends with one line naming the cause.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import stat
import tarfile
import tempfile
import urllib.parse
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from .model.manifest import ModelLoadError, load_manifest
from .startup import Phases

# The URI schemes `fetch` reads; the CRD's storageUri pattern accepts exactly these (a test checks).
SCHEMES = ("file", "http", "https", "s3", "gs")
STAGE_PREFIX = ".fetch-"
MARKER = ".cosyvoice-fetch"  # written into --dest: its content is fetch's own and may be replaced
CHUNK = 1 << 20


class FetchError(Exception):
    exit_code = 1


class Interrupted(FetchError):
    exit_code = 143  # 128 + SIGTERM, as a shell reports it


@dataclass(frozen=True)
class Limits:
    max_bytes: int = 20 * 2**30  # download size, and again the unpacked size
    max_files: int = 10_000
    timeout_s: float = 3600.0


def shown(uri: str) -> str:
    """The URI without user info or query (presigned URLs carry credentials there)."""
    u = urllib.parse.urlsplit(uri)
    if not u.scheme:
        return uri
    return urllib.parse.urlunsplit((u.scheme, u.hostname or "", u.path, "", "")) + ("?…" if u.query else "")


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


class _Budget:
    """Bytes and files a fetch may still write; exceeding either is an error naming the flag."""

    def __init__(self, limits: Limits, what: str) -> None:
        self.bytes_left = limits.max_bytes
        self.files_left = limits.max_files
        self.limits = limits
        self.what = what

    def take_bytes(self, n: int) -> None:
        self.bytes_left -= n
        if self.bytes_left < 0:
            raise FetchError(f"{self.what}: more than {human(self.limits.max_bytes)} (--max-bytes)")

    def check_declared(self, size: int, label: str) -> None:
        """Refuses at once a source whose announced size is already over the cap."""
        if size > self.limits.max_bytes:
            raise FetchError(f"{label}: {human(size)} is more than {human(self.limits.max_bytes)} (--max-bytes)")

    def take_file(self) -> None:
        self.files_left -= 1
        if self.files_left < 0:
            raise FetchError(f"{self.what}: more than {self.limits.max_files} files (--max-files)")


def _copy(src: BinaryIO | Iterator[bytes], dst: Path, budget: _Budget, digest=None) -> None:
    """Copies a stream or chunk iterator into a new file, counting every byte against the budget."""
    chunks = iter(lambda: src.read(CHUNK), b"") if hasattr(src, "read") else src
    with dst.open("xb") as out:
        for block in chunks:
            budget.take_bytes(len(block))
            if digest is not None:
                digest.update(block)
            out.write(block)


# --- sources ----------------------------------------------------------------------------------------

def _http(uri: str, to: Path, budget: _Budget, digest) -> None:
    import httpx

    try:
        with httpx.stream("GET", uri, follow_redirects=True, timeout=httpx.Timeout(60.0)) as r:
            if r.status_code != 200:
                raise FetchError(f"{shown(uri)}: HTTP {r.status_code} {r.reason_phrase}")
            declared = r.headers.get("content-length", "")
            budget.check_declared(int(declared) if declared.isdigit() else 0, shown(uri))
            _copy(r.iter_bytes(CHUNK), to, budget, digest)
    except httpx.HTTPError as exc:
        raise FetchError(f"{shown(uri)}: download failed: {exc.__class__.__name__}: {exc}") from None


def _bucket_key(uri: str) -> tuple[str, str]:
    u = urllib.parse.urlsplit(uri)
    key = u.path.lstrip("/")
    if not u.netloc or not key:
        raise FetchError(f"{uri}: expected {u.scheme}://BUCKET/OBJECT")
    return u.netloc, key


def _s3(uri: str, to: Path, budget: _Budget, digest) -> None:
    try:
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
    except ImportError:
        raise FetchError("s3:// needs boto3 (pip install 'cosyvoice-server[storage]')") from None
    bucket, key = _bucket_key(uri)
    try:
        obj = boto3.client("s3").get_object(Bucket=bucket, Key=key)
        budget.check_declared(obj.get("ContentLength", 0), uri)
        _copy(obj["Body"].iter_chunks(CHUNK), to, budget, digest)
    except NoCredentialsError:
        raise FetchError(f"{uri}: no AWS credentials (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
                         "e.g. from storage.credentialsSecret)") from None
    except ClientError as exc:
        err = exc.response.get("Error", {})
        raise FetchError(f"{uri}: S3 {err.get('Code', '?')}: {err.get('Message') or exc}") from None
    except BotoCoreError as exc:
        raise FetchError(f"{uri}: S3: {exc}") from None


def _gs(uri: str, to: Path, budget: _Budget, digest) -> None:
    try:
        from google.api_core.exceptions import GoogleAPIError
        from google.auth.exceptions import DefaultCredentialsError
        from google.cloud import storage
    except ImportError:
        raise FetchError("gs:// needs google-cloud-storage (pip install 'cosyvoice-server[storage]')") from None
    bucket, key = _bucket_key(uri)
    try:
        try:
            client = storage.Client()
        except DefaultCredentialsError:  # no credentials configured: a public bucket still works
            client = storage.Client.create_anonymous_client()
        blob = client.bucket(bucket).get_blob(key)
        if blob is None:
            raise FetchError(f"{uri}: GCS: no such object")
        budget.check_declared(blob.size or 0, uri)
        with blob.open("rb", chunk_size=CHUNK) as src:
            _copy(src, to, budget, digest)
    except GoogleAPIError as exc:
        raise FetchError(f"{uri}: GCS: {getattr(exc, 'message', None) or exc}") from None
    except DefaultCredentialsError as exc:
        raise FetchError(f"{uri}: GCS credentials: {exc}") from None


def _local_path(uri: str) -> Path | None:
    u = urllib.parse.urlsplit(uri)
    if u.scheme == "file":
        return Path(urllib.parse.unquote(u.path))
    return Path(uri) if u.scheme == "" else None


def _copy_tree(src: Path, out: Path, budget: _Budget) -> None:
    """A local model folder: regular files only; a symlink may point only inside the folder."""
    root = src.resolve()
    for dirpath, dirnames, filenames in os.walk(src):
        here = Path(dirpath)
        rel = here.relative_to(src)
        (out / rel).mkdir(parents=True, exist_ok=True)
        for name in dirnames:
            if (here / name).is_symlink():
                raise FetchError(f"{here / name}: a symlinked folder; copy the real folder instead")
        for name in filenames:
            path = here / name
            real = path.resolve()
            if path.is_symlink() and not real.is_relative_to(root):
                raise FetchError(f"{path}: a symlink pointing outside {src}")
            if not real.is_file():
                raise FetchError(f"{path}: not a regular file")
            budget.take_file()
            with real.open("rb") as f:
                _copy(f, out / rel / name, budget)


# --- archives ---------------------------------------------------------------------------------------

def _member_path(name: str, archive: str) -> PurePosixPath:
    p = PurePosixPath(name)
    if not name or name.startswith("/") or "\\" in name or "\0" in name or ".." in p.parts or (
            p.parts and ":" in p.parts[0]):
        raise FetchError(f"{archive}: refused member {name!r}: absolute, '..' or otherwise unsafe path")
    return p


def _untar(archive: Path, out: Path, budget: _Budget, label: str) -> None:
    with tarfile.open(archive, "r:*") as tf:
        for m in tf:  # one header at a time, so a huge member list is cut off by --max-files
            budget.take_file()
            rel = _member_path(m.name, label)
            if m.isdir():
                (out / rel).mkdir(parents=True, exist_ok=True)
                continue
            if not m.isreg():
                kind = "symlink" if m.issym() else "hard link" if m.islnk() else "device or special file"
                raise FetchError(f"{label}: refused member {m.name!r}: a {kind}; only files and folders are accepted")
            if m.size > budget.bytes_left:
                raise FetchError(f"{label}: unpacks to more than {human(budget.limits.max_bytes)} (--max-bytes)")
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            _copy(tf.extractfile(m), out / rel, budget)


def _unzip(archive: Path, out: Path, budget: _Budget, label: str) -> None:
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
        if len(infos) > budget.limits.max_files:
            raise FetchError(f"{label}: {len(infos)} members, more than {budget.limits.max_files} (--max-files)")
        if sum(i.file_size for i in infos) > budget.limits.max_bytes:
            raise FetchError(f"{label}: unpacks to more than {human(budget.limits.max_bytes)} (--max-bytes)")
        for info in infos:
            budget.take_file()
            rel = _member_path(info.filename, label)
            mode = info.external_attr >> 16
            if info.is_dir():
                (out / rel).mkdir(parents=True, exist_ok=True)
                continue
            if mode and not stat.S_ISREG(mode):
                kind = "symlink" if stat.S_ISLNK(mode) else "device or special file"
                raise FetchError(f"{label}: refused member {info.filename!r}: a {kind}; only files and folders are accepted")
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src:  # counted as it decompresses: declared sizes may lie
                _copy(src, out / rel, budget)


def _unpack(archive: Path, out: Path, limits: Limits, label: str) -> None:
    budget = _Budget(limits, f"{label} (unpacked)")
    out.mkdir()
    try:
        # tar first: a plain tar ending in a zip member (a voice's .npz) passes is_zipfile
        if tarfile.is_tarfile(archive):
            _untar(archive, out, budget, label)
        elif zipfile.is_zipfile(archive):
            _unzip(archive, out, budget, label)
        else:
            raise FetchError(f"{label}: not a tar (.tar, .tar.gz, .tgz, .tar.bz2, .tar.xz) or zip archive")
    except FetchError:
        raise
    except FileExistsError as exc:
        raise FetchError(f"{label}: member {Path(exc.filename).relative_to(out)} appears twice") from None
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError, RuntimeError, NotImplementedError,
            ValueError) as exc:  # zlib/lzma/bz2 errors, encrypted or unsupported zip members
        raise FetchError(f"{label}: corrupt or unsupported archive: {exc.__class__.__name__}: {exc}") from None


# --- the staging folder, the deadline and the commit ------------------------------------------------

@contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Raises FetchError in the main thread when the whole fetch takes longer than `seconds`."""
    def expire(signum, frame):
        raise FetchError(f"gave up after the deadline of {seconds:g} s (--timeout-s)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def _staging(dest: Path) -> Iterator[Path]:
    try:
        dest.mkdir(parents=True, exist_ok=True)
        for old in dest.glob(STAGE_PREFIX + "*"):  # left by a run that was killed with SIGKILL
            shutil.rmtree(old)
        others = sorted(p.name for p in dest.iterdir() if p.name != MARKER)
        if others and not (dest / MARKER).exists():
            raise FetchError(f"{dest}: not empty and not filled by fetch before ({', '.join(others[:3])}); "
                             "give an empty or new directory")
        stage = Path(tempfile.mkdtemp(prefix=STAGE_PREFIX, dir=dest))
    except OSError as exc:
        raise FetchError(f"{dest}: cannot write there: {exc.strerror or exc}") from None
    try:
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _model_root(tree: Path, label: str) -> Path:
    """The model files may sit at the top of the source or inside one folder."""
    if (tree / "model.yaml").is_file():
        return tree
    found = sorted(p.parent for p in tree.glob("*/model.yaml"))
    if len(found) == 1:
        return found[0]
    raise FetchError(f"{label}: no model.yaml at the top or in exactly one folder")


def _commit(root: Path, stage: Path, dest: Path, record: str) -> None:
    """Renames the model into dest (one filesystem: no copy); model.yaml goes last."""
    (dest / MARKER).write_text(record)
    previous = stage / "previous"
    previous.mkdir()
    for p in dest.iterdir():
        if p.name not in (MARKER, stage.name):
            p.rename(previous / p.name)
    for p in sorted(root.iterdir(), key=lambda p: p.name == "model.yaml"):
        p.rename(dest / p.name)


def _already_there(dest: Path, record: str) -> bool:
    marker = dest / MARKER
    try:
        return marker.read_text() == record and (dest / "model.yaml").is_file() and load_manifest(dest) is not None
    except (OSError, ModelLoadError):
        return False


def fetch(uri: str, dest: Path, sha256: str | None = None, limits: Limits = Limits(),
          phases: Phases | None = None) -> Path:
    """Fills `dest` with the model at `uri`; returns `dest`. Raises FetchError with a one-line message.
    `phases` times the download (or copy) and the unpacking."""
    phases = phases or Phases(emit=lambda line: None)
    label = shown(uri)
    scheme = urllib.parse.urlsplit(uri).scheme
    if scheme not in ("", *SCHEMES):
        raise FetchError(f"{label}: unsupported scheme '{scheme}' (use a path, {', '.join(s + '://' for s in SCHEMES)})")
    expected = sha256.lower() if sha256 else None
    record = f"{label}\nsha256={expected}\n"
    if expected and _already_there(dest, record):
        return dest  # an init container re-run in the same pod: the verified model is in place
    with _deadline(limits.timeout_s), _staging(dest) as stage:
        local = _local_path(uri)
        tree = stage / "tree"
        if local is not None and local.is_dir():
            if expected:
                raise FetchError(f"{label}: --sha256 checks an archive; the source is a directory")
            with phases("copy"):
                _copy_tree(local, tree, _Budget(limits, label))
        else:
            archive = stage / "archive"
            digest = hashlib.sha256()
            budget = _Budget(limits, label)
            with phases("download"):
                if local is not None:
                    try:
                        with local.open("rb") as f:
                            _copy(f, archive, budget, digest)
                    except OSError as exc:
                        raise FetchError(f"{local}: {exc.strerror or exc}") from None
                else:
                    {"http": _http, "https": _http, "s3": _s3, "gs": _gs}[scheme](uri, archive, budget, digest)
            if expected and (got := digest.hexdigest()) != expected:
                raise FetchError(f"{label}: SHA-256 mismatch: expected {expected}, got {got}")
            with phases("unpack"):
                _unpack(archive, tree, limits, label)
                archive.unlink()
        root = _model_root(tree, label)
        try:
            load_manifest(root)
        except ModelLoadError as exc:
            raise FetchError(f"{label}: {exc}") from None
        try:
            _commit(root, stage, dest, record)
        except OSError as exc:
            raise FetchError(f"{dest}: cannot move the model in place: {exc.strerror or exc}") from None
    return dest


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Turns SIGTERM (a deleted pod, a timed-out init container) into Interrupted, so the staging
    folder is removed on the way out."""
    def stop(signum, frame):
        raise Interrupted(f"stopped by {signal.Signals(signum).name}; nothing was left in the destination")

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
