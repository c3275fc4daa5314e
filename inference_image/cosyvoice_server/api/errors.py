"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, mapped in one place.

A user's mistake is a 4xx with a message that says what to change; the server's own failures are a
5xx with a message, never a bare stack trace.
"""

from __future__ import annotations

import logging

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
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def validation_message(errors: list[dict]) -> tuple[str, str | None, str]:
    """First pydantic error as (message, param, code)."""
    e = errors[0]
    loc = [str(x) for x in e.get("loc", ()) if x not in ("body",)]
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
