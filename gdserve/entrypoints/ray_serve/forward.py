"""What travels between the ingress and an engine replica: one HTTP request whole, then its response
as a ResponseStart followed by body chunks. The request carries its prefix key, which the router reads."""
import hashlib
import json
from dataclasses import dataclass

Headers = list[tuple[bytes, bytes]]

# The response header naming the replica that answered.
REPLICA_HEADER = b"x-gdserve-replica"


@dataclass(frozen=True)
class ForwardedRequest:
    method: str
    path: str
    query_string: bytes
    headers: Headers
    body: bytes
    prefix_key: int | None = None  # None: no prompt to keep together (GET /v1/models, ...)


@dataclass(frozen=True)
class ResponseStart:
    status: int
    headers: Headers

    @property
    def is_event_stream(self) -> bool:
        return any(name.lower() == b"content-type" and value.startswith(b"text/event-stream")
                   for name, value in self.headers)


def prefix_key(body: bytes, prefix_chars: int) -> int | None:
    """A hash of the model and the first prefix_chars characters of the prompt a request body
    holds (its messages and tools, or its prompt); None for a body without one, or prefix_chars 0."""
    if prefix_chars <= 0:
        return None
    try:
        request = json.loads(body)
    except ValueError:
        return None
    text = _prompt_text(request) if isinstance(request, dict) else None
    if not text:
        return None
    head = f"{request.get('model')}\n{text[:prefix_chars]}"
    return int.from_bytes(hashlib.blake2b(head.encode(errors="replace"), digest_size=8).digest(), "big")


def _prompt_text(request: dict) -> str | None:
    """The text a request's prompt starts with, in the order the chat template renders it."""
    if isinstance(request.get("messages"), list):
        tools = json.dumps(request["tools"], sort_keys=True) if request.get("tools") else ""
        return tools + "".join(_message_text(m) for m in request["messages"])
    prompt = request.get("prompt", request.get("input"))
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        prompt = prompt[0]  # a batch: its first prompt
    if isinstance(prompt, list):
        return " ".join(map(str, prompt))  # token ids
    return prompt if isinstance(prompt, str) else None


def _message_text(message: object) -> str:
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return f"{message.get('role')}:{content if isinstance(content, str) else ''}\n"
