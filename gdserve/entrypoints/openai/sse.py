"""Server-sent events: `data: {json}` frames, an error frame on failure, `data: [DONE]` at the end."""
import json
from collections.abc import AsyncIterator

from fastapi.responses import StreamingResponse

from gdserve.engine.async_llm import EngineDeadError, RequestFailed
from gdserve.entrypoints.openai.errors import APIError, engine_failure, internal_error_body


# Characters that JSON leaves raw but Python's str.splitlines (and so httpx's aiter_lines, which
# many clients read SSE with) breaks lines at: escaped, a generated "\u2028" would cut a frame.
_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def frame(data: dict) -> str:
    body = json.dumps(data, ensure_ascii=False, separators=(',', ':')).translate(_LINE_BREAKS)
    return f"data: {body}\n\n"


async def _events(chunks: AsyncIterator[dict]) -> AsyncIterator[str]:
    try:
        async for chunk in chunks:
            yield frame(chunk)
    except APIError as e:
        yield frame(e.body())
    except (RequestFailed, EngineDeadError) as e:
        yield frame(engine_failure(e).body())
    except Exception as e:  # headers are sent: report in-band rather than cut the stream
        yield frame(internal_error_body(e))
    finally:
        await chunks.aclose()
    yield "data: [DONE]\n\n"


def sse_response(chunks: AsyncIterator[dict], headers: dict[str, str] | None = None) -> StreamingResponse:
    return StreamingResponse(_events(chunks), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})})
