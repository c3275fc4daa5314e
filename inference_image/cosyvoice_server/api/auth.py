"""Bearer-key authentication for /v1/* and the API documents."""

from __future__ import annotations

import hmac

from fastapi import Request

from .errors import APIError


async def require_api_key(request: Request) -> None:
    key: str | None = request.app.state.server.api_key
    if key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    # Constant-time: the time to reject must not tell how much of a guess was right.
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        raise APIError(401, "Missing or incorrect API key: send 'Authorization: Bearer <key>'.",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
