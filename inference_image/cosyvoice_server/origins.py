"""Browser origins (RFC 6454) for the WebSocket's Origin policy: parsed once from the setting, compared
in one normal form.

A browser sends `Origin` on every WebSocket handshake and cannot be made to lie about it; other
clients (servers, CLIs) send none. So a handshake without `Origin` is not a web page acting with a
visitor's browser, and one with an `Origin` is allowed only when that origin is listed.
"""

from __future__ import annotations

from urllib.parse import urlsplit

ANY = "*"
_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin_key(value: str) -> str | None:
    """`scheme://host[:port]` in normal form (lower case, the scheme's default port left out), or None
    for what is not an http(s) origin: `null` (sandboxed pages, files, some redirects), a path, a user."""
    try:
        u = urlsplit(value.strip())
        port = u.port
    except ValueError:
        return None
    if (u.scheme not in _DEFAULT_PORTS or not u.hostname or u.path not in ("", "/") or u.query or u.fragment
            or u.username is not None):
        return None
    host = f"[{u.hostname}]" if ":" in u.hostname else u.hostname
    return f"{u.scheme}://{host}" + (f":{port}" if port is not None and port != _DEFAULT_PORTS[u.scheme] else "")


def parse_allowed_origins(spec: str | None) -> frozenset[str]:
    """`https://app.example.com, http://localhost:3000` -> their normal forms; `*` allows every origin.
    ValueError names an entry that is not an origin (`null` included: every sandboxed page sends it)."""
    entries = [e.strip() for e in (spec or "").split(",") if e.strip()]
    if ANY in entries:
        return frozenset({ANY})
    keys = {e: origin_key(e) for e in entries}
    bad = [e for e, k in keys.items() if k is None]
    if bad:
        raise ValueError(f"expected origins such as https://app.example.com (scheme://host[:port]) separated by "
                         f"commas, or *; got {bad[0]!r}" + (" (any sandboxed page or file sends null)"
                                                             if bad[0].lower() == "null" else ""))
    return frozenset(k for k in keys.values() if k is not None)


def origin_allowed(values: list[str], allowed: frozenset[str]) -> bool:
    """Whether a handshake with these `Origin` header values may open a session: none (not a browser),
    or exactly one that is listed. Two Origin headers are refused: no browser sends them."""
    if not values:
        return True
    if len(values) > 1:
        return False
    if ANY in allowed:
        return True
    key = origin_key(values[0])
    return key is not None and key in allowed


def is_own_origin(values: list[str], host: str | None) -> bool:
    """Whether a handshake's one `Origin` is the host it was sent to, i.e. the page that opens it was served
    from this server's own address (the playground). A page elsewhere cannot make a browser send that pair:
    the browser writes both headers. The scheme is not compared: behind a TLS-terminating proxy the page is
    https while the server sees plain HTTP."""
    if len(values) != 1 or not host:
        return False
    key = origin_key(values[0])
    if key is None:
        return False
    scheme, _, authority = key.partition("://")
    default_port = f":{_DEFAULT_PORTS[scheme]}"
    host = host.strip().lower()
    return authority == (host[:-len(default_port)] if host.endswith(default_port) else host)
