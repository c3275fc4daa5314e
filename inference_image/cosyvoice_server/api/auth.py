"""Bearer-key authentication for /v1/*, the API documents and the speech WebSocket."""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from fastapi import Request

from .errors import APIError

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


def _token(value: str) -> str:
    """The credential of one `Authorization` value; "" unless it is a bearer token (scheme case-insensitive)."""
    scheme, _, token = value.partition(" ")
    return token.strip(" \t") if scheme.lower() == "bearer" else ""


def matches(presented: str, keys: Iterable[str]) -> bool:
    """Constant-time per key: the time to reject must not tell how much of a guess was right."""
    return any([hmac.compare_digest(presented.encode(), k.encode()) for k in keys])


def presented_tokens(values: Sequence[str]) -> list[str]:
    """The bearer tokens of a request's `Authorization` headers (each header one; repeated headers all count)."""
    return [_token(v) for v in values]


async def require_api_key(request: Request) -> None:
    """The API key, or the voice registration key (which may do everything the API key may). One
    `Authorization` header: with two, one may be right and the other not, and the server does not pick."""
    state = request.app.state.server
    if state.api_key is None:
        return
    keys = [k.current() for k in (state.api_key, state.registration_key) if k is not None]
    tokens = presented_tokens(request.headers.getlist("authorization"))
    if len(tokens) != 1 or not matches(tokens[0], keys):
        raise APIError(401, "Missing or incorrect API key: send one 'Authorization: Bearer <key>' header.",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
