"""gdserve: a structured-output LLM serving engine."""
import importlib

# Lazy, so `import gdserve.kernels` or `gdserve.grammar` does not load the engine.
_EXPORTS = {
    "LLM": "gdserve.engine.llm",
    "SamplingParams": "gdserve.sampling_params",
    "StructuredOutputsParams": "gdserve.sampling_params",
    "GuidedDecodingParams": "gdserve.sampling_params",
    "RequestOutput": "gdserve.outputs",
    "CompletionOutput": "gdserve.outputs",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'gdserve' has no attribute {name!r}")
