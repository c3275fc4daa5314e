"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`: every Refusal (refusals.py)
rendered for HTTP in one place.

A user's mistake is a 4xx with a message that says what to change; the server's own failures are a
5xx with a message, never a bare stack trace.
"""

from __future__ import annotations

import json
import logging
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..refusals import INTERNAL, MISSING_PARAMETER, NOT_JSON, Refusal

log = logging.getLogger(__name__)


def response(refusal: Refusal) -> JSONResponse:
    """A refusal as the HTTP API answers it: its status, headers and OpenAI's error object."""
    return _ErrorResponse({"error": refusal.error()}, status_code=refusal.status, headers=refusal.headers)


class _ErrorResponse(JSONResponse):
    def render(self, content: object) -> bytes:
        # ASCII with escapes: a message that quotes the request (a lone surrogate, say) still encodes
        return json.dumps(content, separators=(",", ":")).encode()


# pydantic names the member of a union that failed in `loc` (str, VoiceRef, literal[...], function-after[...]);
# a request's own names are snake_case fields and list indices
_UNION_MEMBER = re.compile(r"(?:str|int|float|bool|bytes|none|[A-Z]\w*|[\w-]+\[.*\]|constrained-\w+)")


def validation_message(errors: list[dict]) -> tuple[str, str | None, str]:
    """The first field's pydantic error as (message, param, code); of a union's errors, the one from the
    member that got furthest (a voice object's bad id, not "voice should be a string")."""
    def path(err: dict) -> list[str]:
        return [str(x) for x in err.get("loc", ()) if x != "body" and not _UNION_MEMBER.fullmatch(str(x))]

    field = path(errors[0])[:1]
    e = max((x for x in errors if path(x)[:1] == field), key=lambda x: len(x.get("loc", ())))
    loc = path(e)
    param = ".".join(loc) or None
    if e.get("type") == "json_invalid":
        return NOT_JSON.template, None, NOT_JSON.code
    if e.get("type") == "missing":
        return MISSING_PARAMETER.template.format(name=param), param, MISSING_PARAMETER.code
    if e.get("type") == "extra_forbidden":
        return f"Unrecognized request argument: '{param}'.", param, "unknown_parameter"
    got = e.get("input")
    shown = f" (got {got!r})" if got is not None and not isinstance(got, (dict, list)) and len(repr(got)) < 80 else ""
    msg = e.get("msg", "invalid value").removeprefix("Value error, ")
    return f"Invalid value for '{param}': {msg}{shown}.", param, "invalid_value"


_STATUS_CODES = {401: "unauthorized", 404: "not_found", 405: "method_not_allowed", 413: "request_too_large",
                 415: "unsupported_media_type"}


def body_error(message: str, param: str | None, code: str) -> Refusal:
    """A request body the API cannot take (pydantic's or the parser's words): 400."""
    return Refusal(code, 400, message, param=param)


def install(app: FastAPI) -> None:
    @app.exception_handler(Refusal)
    async def _refusal(_: Request, exc: Refusal) -> JSONResponse:
        return response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return response(body_error(*validation_message(list(exc.errors()))))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = str(exc.detail) if exc.status_code != 404 else f"No route for {request.method} {request.url.path}."
        return response(Refusal(_STATUS_CODES.get(exc.status_code), exc.status_code, message,
                                headers=dict(exc.headers or {})))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return response(INTERNAL(exception=exc.__class__.__name__))
