"""The keys in force (API, voice registration, voice admin), each re-read from its mounted Secret when it
is rotated. Below the API: the server's state holds them, the API's checks (api/auth.py) compare them."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)
RECHECK_S = 1.0  # how often a key file is looked at for a rotation


class RotatingKey:
    """A key, re-read from its file when the file changes: a rotated Secret takes effect without a restart
    (Kubernetes swaps the mounted volume's ..data symlink; the file seen through it is a new one). A file
    that becomes empty or unreadable keeps the last key: authentication never turns itself off."""

    def __init__(self, value: str, path: Path | None = None, what: str = "API key") -> None:
        self._value = value
        self._path = path
        self._what = what
        self._lock = threading.Lock()
        self._seen = self._signature()
        self._checked = time.monotonic()

    def _signature(self) -> tuple[int, int, int] | None:
        try:
            st = self._path.stat() if self._path is not None else None
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size) if st is not None else None

    def current(self) -> str:
        if self._path is None or time.monotonic() - self._checked < RECHECK_S:
            return self._value
        with self._lock:
            self._checked = time.monotonic()
            seen = self._signature()
            if seen is None or seen == self._seen:
                return self._value
            self._seen = seen
            try:
                new = self._path.read_bytes().decode("utf-8").strip()
            except (OSError, UnicodeDecodeError):
                new = ""
            if not new:
                log.warning("%s file %s changed but holds no key; the previous key stays in force", self._what,
                            self._path)
            elif new != self._value:
                self._value = new
                log.info("%s file %s changed: the new key is in force", self._what, self._path)
            return self._value
