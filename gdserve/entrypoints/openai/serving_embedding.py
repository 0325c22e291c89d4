"""POST /v1/embeddings: the mean-pooled, L2-normalized last hidden state of each input."""
import base64

import numpy as np

from gdserve.entrypoints.openai.errors import APIError, bad_request
from gdserve.entrypoints.openai.protocol import EmbeddingRequest
from gdserve.entrypoints.openai.serving import ServingContext, encode_prompts


async def create_embedding(ctx: ServingContext, request: EmbeddingRequest) -> dict:
    if ctx.resolve_model(request.model) is not None:
        raise bad_request(f"embeddings are not supported with LoRA adapters: `{request.model}` is one; "
                          f"use the base model `{ctx.served_model_name}`", "model")
    inputs = [token_ids for _, token_ids in encode_prompts(ctx, request.input, "input")]
    hidden_size = ctx.engine.engine.model_config.hidden_size
    if request.dimensions is not None and request.dimensions != hidden_size:
        raise bad_request(f"dimensions must be {hidden_size} (this model's embedding size) or left out",
                          "dimensions")
    data = []
    for i, token_ids in enumerate(inputs):
        try:
            vector = await ctx.engine.embed(token_ids)
        except ValueError as e:
            raise bad_request(f"input[{i}]: {e}", "input") from None
        except RuntimeError as e:  # no free KV blocks right now
            raise APIError(429, str(e), code="kv_cache_full") from None
        data.append({"object": "embedding", "index": i, "embedding": _encode(vector, request.encoding_format)})
    num_tokens = sum(map(len, inputs))
    return {"object": "list", "data": data, "model": ctx.served_model_name,
            "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens}}


def _encode(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":  # what the openai SDK asks for by default
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
    return vector
