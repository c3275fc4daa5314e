"""Who may open a WebSocket speech connection, and how many at once: decided in the handshake, before
the socket is accepted, so that a refused connection costs neither a session nor a coroutine waiting
for its first message.

- Origin: a browser's handshake carries one, and it is accepted only when listed in
  `stream_allowed_origins` (none by default), so a web page cannot use its visitors' browsers to open
  sessions. Clients that send none are not browsers and are not affected (origins.py).
- Per client: `stream_max_sessions_per_client` connections (sessions and those not yet past
  `session.update`); the client is its key when one is in force (every holder of a key is one client),
  else its address.
- Before `session.update`: `stream_max_pending_connections` together, each for at most the idle timeout.

The admission slot a session takes at `session.update`, and the share kept for HTTP requests, are the
scheduler's (scheduling/scheduler.py `refusal`).
"""

from __future__ import annotations

import hashlib
from collections import Counter

from ..metrics import Metrics
from ..refusals import ORIGIN_NOT_ALLOWED, TOO_MANY_CONNECTIONS, TOO_MANY_SESSIONS, Refusal, shown


def origin_refusal(origin: str) -> Refusal:
    return ORIGIN_NOT_ALLOWED(origin=shown(origin))


def client_of(presented_keys: list[str], host: str | None) -> str:
    """The identity the per-client cap counts: the key(s) presented, when a key is in force (as a digest,
    never the key itself), else the peer's address."""
    if presented_keys:
        return "key:" + hashlib.sha256("\0".join(sorted(set(presented_keys))).encode()).hexdigest()[:24]
    return "addr:" + (host or "unknown")


class Connections:
    """The open connections of the WebSocket speech endpoint: per client, and those before `session.update`
    (event loop only)."""

    def __init__(self, per_client: int, max_pending: int, metrics: Metrics) -> None:
        self.per_client = per_client  # 0: no cap
        self.max_pending = max_pending
        self.m = metrics
        self._by_client: Counter[str] = Counter()
        self._pending = 0

    def admit(self, client: str) -> Connection | Refusal:
        if self.per_client and self._by_client[client] >= self.per_client:
            return TOO_MANY_SESSIONS(held=self._by_client[client], cap=self.per_client)
        if self._pending >= self.max_pending:
            return TOO_MANY_CONNECTIONS(pending=self._pending)
        self._by_client[client] += 1
        self._pending += 1
        self.m.stream_connections_pending.set(self._pending)
        return Connection(self, client)

    def _started(self) -> None:
        self._pending -= 1
        self.m.stream_connections_pending.set(self._pending)

    def _closed(self, client: str) -> None:
        self._by_client[client] -= 1
        if self._by_client[client] <= 0:
            del self._by_client[client]


class Connection:
    """One admitted connection: pending until its session starts (or it ends), counted until it closes."""

    def __init__(self, ledger: Connections, client: str) -> None:
        self._ledger = ledger
        self.client = client
        self.pending = True
        self.open = True

    def session_started(self) -> None:
        if self.pending:
            self.pending = False
            self._ledger._started()

    def close(self) -> None:
        if self.open:
            self.session_started()
            self.open = False
            self._ledger._closed(self.client)
