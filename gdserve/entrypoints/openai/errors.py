"""OpenAI-shaped errors: {"error": {"message", "type", "param", "code"}}. An error body never carries
a traceback, a file path or an unexpected exception's text: a 500 says only an error id, which
finds the traceback in the server log."""
import logging
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gdserve.engine.async_llm import EngineDeadError, RequestFailed

logger = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          413: "invalid_request_error", 422: "invalid_request_error", 429: "rate_limit_error",
          500: "internal_server_error", 503: "service_unavailable"}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        return error_body(self.status, self.message, self.param, self.code)


def engine_failure(e: RequestFailed | EngineDeadError) -> APIError:
    """A request the engine failed is a 500; one it can no longer take (shut down) a 503."""
    if isinstance(e, EngineDeadError):
        return APIError(503, f"the engine is unavailable: {e}", code="engine_unavailable")
    return APIError(500, f"the request failed in the engine: {e}")


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


def error_response(status: int, message: str, param: str | None = None,
                   code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status)


def internal_error_body(e: BaseException) -> dict:
    """A 500's body; the traceback goes to the server log under the error id the body gives."""
    error_id = uuid.uuid4().hex[:16]
    logger.error("internal error %s", error_id, exc_info=e)
    return error_body(500, f"internal server error (error id {error_id}; the server log has the details)")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(_: Request, e: APIError) -> JSONResponse:
        return error_response(e.status, e.message, e.param, e.code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, e: RequestValidationError) -> JSONResponse:
        errors = e.errors()
        if errors and errors[0].get("type") == "json_invalid":
            ctx = errors[0].get("ctx", {})
            return error_response(422, f"the body is not valid JSON: {ctx.get('error', 'decode error')} "
                                       f"at position {errors[0]['loc'][-1]}")
        fields = [".".join(map(str, x.get("loc", ())[1:])) or "body" for x in errors]
        message = "; ".join(f"{f}: {x.get('msg')}" for f, x in zip(fields[:5], errors))
        return error_response(422, f"malformed request: {message}", fields[0] if fields else None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        if e.status_code == 400 and e.__cause__ is not None:  # FastAPI's "error parsing the body"
            return error_response(422, _unparsable_body(e.__cause__))
        return error_response(e.status_code, str(e.detail))

    @app.exception_handler(Exception)
    async def internal_error(_: Request, e: Exception) -> JSONResponse:
        return JSONResponse(internal_error_body(e), status_code=500)


def _unparsable_body(cause: BaseException) -> str:
    if isinstance(cause, UnicodeDecodeError):
        return f"the body is not valid UTF-8: {cause.reason} at byte {cause.start}"
    if isinstance(cause, RecursionError):
        return "the body's JSON nests too deeply to parse"
    return "the body could not be read as JSON"
