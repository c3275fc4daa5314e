"""The server's pronunciation lexicons (GET /v1/audio/lexicons), for choosing what to send as `lexicons`."""

from __future__ import annotations

from typing import Any

import httpx


async def lexicons(base_url: str, *, api_key: str | None = None, timeout: float = 10.0) -> list[dict[str, Any]]:
    """Each lexicon: id, default, graphemes, alphabet, lang, error (see the API reference)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    async with httpx.AsyncClient(timeout=timeout) as client:
        r = await client.get(base_url.rstrip("/") + "/v1/audio/lexicons", headers=headers)
        r.raise_for_status()
        return r.json()["data"]
