"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, mapped in one place.

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

log = logging.getLogger(__name__)


class APIError(Exception):
    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        return _ErrorResponse(body, status_code=self.status, headers=self.headers)


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
        return "The request body is not valid JSON.", None, "invalid_json"
    if e.get("type") == "missing":
        return f"Missing required parameter: '{param}'.", param, "missing_required_parameter"
    if e.get("type") == "extra_forbidden":
        return f"Unrecognized request argument: '{param}'.", param, "unknown_parameter"
    got = e.get("input")
    shown = f" (got {got!r})" if got is not None and not isinstance(got, (dict, list)) and len(repr(got)) < 80 else ""
    msg = e.get("msg", "invalid value").removeprefix("Value error, ")
    return f"Invalid value for '{param}': {msg}{shown}.", param, "invalid_value"


_STATUS_CODES = {401: "unauthorized", 404: "not_found", 405: "method_not_allowed", 413: "request_too_large",
                 415: "unsupported_media_type"}


def install(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        msg, param, code = validation_message(list(exc.errors()))
        return APIError(400, msg, param=param, code=code).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = str(exc.detail) if exc.status_code != 404 else f"No route for {request.method} {request.url.path}."
        return APIError(exc.status_code, message, code=_STATUS_CODES.get(exc.status_code), headers=exc.headers).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return APIError(500, f"Internal server error ({exc.__class__.__name__}); see the server log.",
                        type="server_error", code="internal_error").response()
