"""Bearer-key authentication for /v1/* and the API documents."""

from __future__ import annotations

import hmac

from fastapi import Request

from .errors import APIError


async def require_api_key(request: Request) -> None:
    """The API key, or the voice registration key (which may do everything the API key may)."""
    state = request.app.state.server
    key: str | None = state.api_key
    if key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    keys = [k for k in (key, state.registration_key) if k is not None]
    # Constant-time: the time to reject must not tell how much of a guess was right.
    if scheme.lower() != "bearer" or not any([hmac.compare_digest(token.strip().encode(), k.encode()) for k in keys]):
        raise APIError(401, "Missing or incorrect API key: send 'Authorization: Bearer <key>'.",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
