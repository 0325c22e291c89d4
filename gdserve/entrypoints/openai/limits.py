"""What one request may ask for. Past a limit the answer is a 4xx whose message names the limit:
413 for the body (middleware.BodyLimitMiddleware), 400 for the rest."""
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gdserve.grammar import GrammarError

if TYPE_CHECKING:
    from gdserve.entrypoints.openai.protocol import SamplingRequest


def bad_request(message: str, param: str):
    """errors.bad_request, imported here on first use: the CLI reads RequestLimits' defaults, and
    `gdserve bench ...` must load where the server's dependencies (fastapi, pydantic) are absent."""
    from gdserve.entrypoints.openai.errors import bad_request
    return bad_request(message, param)


@dataclass(frozen=True)
class RequestLimits:
    max_request_bytes: int = 4 << 20  # --max-request-bytes
    max_n: int = 16                   # --max-n: samples per prompt (OpenAI's own cap is 128, vLLM has none)
    max_stop: int = 16                # stop sequences per request (OpenAI allows 4)
    max_stop_chars: int = 256         # characters in one stop sequence
    # JSON Schema documents: nesting of objects and arrays, and values in all. The largest schema in
    # maskbench-dev nests 27 deep and holds 12,814 values; the compiler recurses on nesting.
    max_schema_depth: int = 64
    max_schema_values: int = 50_000
    max_inputs: int = 2048            # prompts in one completions request, inputs in one embeddings request (OpenAI's cap)

    def check_sampling(self, request: "SamplingRequest") -> None:
        """A 400 for n or stop sequences past the limits."""
        if request.n > self.max_n:
            raise bad_request(f"n must be <= {self.max_n} (this server's --max-n), got {request.n}", "n")
        stop = [request.stop] if isinstance(request.stop, str) else request.stop or []
        if len(stop) > self.max_stop:
            raise bad_request(f"stop takes at most {self.max_stop} sequences, got {len(stop)}", "stop")
        if any(len(s) > self.max_stop_chars for s in stop):
            longest = max(map(len, stop))
            raise bad_request(f"a stop sequence may have at most {self.max_stop_chars} characters, got one of "
                              f"{longest}", "stop")

    def check_inputs(self, count: int, param: str) -> None:
        """A 400 for a batch of prompts (or embedding inputs) past the limit."""
        if count > self.max_inputs:
            raise bad_request(f"{param} takes at most {self.max_inputs} prompts in one request, got {count}", param)

    def check_schema(self, schema: object) -> None:
        """GrammarError for a JSON Schema document nested deeper, or holding more values, than the limits."""
        stack, values = [(schema, 1)], 0
        while stack:
            node, depth = stack.pop()
            if not isinstance(node, (dict, list)):
                continue
            if depth > self.max_schema_depth:
                raise GrammarError(f"the schema nests objects and arrays more than {self.max_schema_depth} "
                                   "deep (this server's limit)")
            children = list(node.values()) if isinstance(node, dict) else node
            values += len(children)
            if values > self.max_schema_values:
                raise GrammarError(f"the schema holds more than {self.max_schema_values} values "
                                   "(this server's limit)")
            stack.extend((child, depth + 1) for child in children)
