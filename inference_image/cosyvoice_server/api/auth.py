"""Bearer-key authentication for /v1/*, the API documents and the speech WebSocket."""

from __future__ import annotations

import functools
import hashlib
import hmac
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fastapi import Request

from ..refusals import BAD_KEY, Refusal

ANONYMOUS = "anonymous"  # the owner of voices registered on a server whose registration needs no key
# A key's fingerprint is a slow hash: voice.json, readable by whoever reads the volume, must not help guess the key.
_FINGERPRINT_SALT, _FINGERPRINT_ROUNDS = b"cosyvoice voice owner", 100_000


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


def unauthorized() -> Refusal:
    return BAD_KEY(how="one 'Authorization: Bearer <key>' header")


@functools.lru_cache(maxsize=8)
def key_fingerprint(key: str) -> str:
    """A stable, non-secret identity of a key (`key:` and 16 hex digits), recorded as the owner of the voices
    it registers; it changes when the key does."""
    return "key:" + hashlib.pbkdf2_hmac("sha256", key.encode(), _FINGERPRINT_SALT, _FINGERPRINT_ROUNDS).hex()[:16]


@dataclass(frozen=True)
class VoiceCaller:
    """What a request may do with registered voices. `register`: register voices, delete its own and read
    transcripts (the registration key); `admin`: delete any registered voice and read transcripts (the admin
    key); neither: list and use voices (the API key). `owner`: the identity its registrations record."""

    register: bool = False
    admin: bool = False
    owner: str | None = None

    @property
    def sees_transcripts(self) -> bool:
        return self.register or self.admin


def voice_caller(tokens: Sequence[str], api_key: str | None, registration_key: str | None, admin_key: str | None,
                 registration_open: bool, owner_name: str | None) -> VoiceCaller | None:
    """Who a request to /v1/audio/voices is, from its bearer tokens and the keys in force; None: 401.

    Without a key for a role, that role is open to every caller: with no registration key (and
    `registration_open`) anyone registers as `owner_name` or ANONYMOUS, and with no admin key as well,
    anyone is admin, as access control is then off. With an API key, a request must present one key."""
    token = tokens[0] if len(tokens) == 1 else None
    owner = owner_name or (key_fingerprint(registration_key) if registration_key is not None else ANONYMOUS)
    if token is not None and admin_key is not None and matches(token, [admin_key]):
        return VoiceCaller(admin=True)
    if token is not None and registration_key is not None and matches(token, [registration_key]):
        return VoiceCaller(register=True, owner=owner)
    if api_key is not None and not (token is not None and matches(token, [api_key])):
        return None
    if registration_open and registration_key is None:
        return VoiceCaller(register=True, admin=admin_key is None, owner=owner)
    return VoiceCaller()


async def require_api_key(request: Request) -> None:
    """The API key, or the voice registration key (which may do everything the API key may). One
    `Authorization` header: with two, one may be right and the other not, and the server does not pick."""
    state = request.app.state.server
    if state.api_key is None:
        return
    keys = [k.current() for k in (state.api_key, state.registration_key) if k is not None]
    tokens = presented_tokens(request.headers.getlist("authorization"))
    if len(tokens) != 1 or not matches(tokens[0], keys):
        raise unauthorized()
