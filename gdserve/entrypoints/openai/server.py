"""`gdserve serve`: load the engine (printing progress), then run the app under uvicorn."""
import argparse
import asyncio
import logging
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from gdserve.config import EngineConfig
from gdserve.utils import settle_gc
from gdserve.entrypoints.openai.limits import RequestLimits
from gdserve.entrypoints.openai.lora_modules import RUNTIME_LORA_ENV, parse_lora_module, runtime_lora_from_env

if TYPE_CHECKING:
    from fastapi import FastAPI

    from gdserve.engine.async_llm import AsyncLLM


def add_serve_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", help="require `Authorization: Bearer KEY` on every path but /health "
                                          "(/metrics and /openapi.json included)")
    parser.add_argument("--served-model-name", help="the model id clients send (default: MODEL)")
    parser.add_argument("--chat-template", help="a Jinja chat template file overriding the tokenizer's")
    parser.add_argument("--max-queue", type=_positive_int,
                        help="answer 429 beyond this many waiting + running requests")
    limits = RequestLimits()
    parser.add_argument("--max-n", type=_positive_int, default=limits.max_n,
                        help=f"the largest `n` (samples per prompt) a request may ask for; more is a 400 "
                             f"(default: %(default)s; OpenAI's cap is 128). Other fixed limits: "
                             f"{limits.max_stop} stop sequences of {limits.max_stop_chars} characters at most, "
                             f"{limits.max_inputs} prompts per request, "
                             f"JSON Schemas {limits.max_schema_depth} objects/arrays deep and "
                             f"{limits.max_schema_values} values at most")
    parser.add_argument("--max-request-bytes", type=_positive_int, default=limits.max_request_bytes,
                        help="answer 413 to a request body larger than this, unread (default: %(default)s)")
    parser.add_argument("--allowed-origins", type=_comma_list, action="extend", metavar="ORIGINS",
                        help="CORS: origins (comma-separated or repeated; * for any) whose browser pages may "
                             "call the API; without it no CORS headers are sent")
    parser.add_argument("--lora-modules", type=parse_lora_module, nargs="+", action="extend", metavar="MODULE",
                        help="LoRA adapters loaded at startup (with --enable-lora), each name=path or "
                             '\'{"name": ..., "path": ..., "base_model_name": ...}\'; a request\'s `model` '
                             "picks one by name")
    parser.add_argument("--allow-runtime-lora", action="store_true",
                        help="add POST /v1/load_lora_adapter and /v1/unload_lora_adapter (with --enable-lora; "
                             f"also on when {RUNTIME_LORA_ENV} is 1 or true)")
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])


# On SIGTERM, requests in flight have this long to finish before they are failed (draining.py).
SHUTDOWN_GRACE_S = 5.0


def run_server(args: argparse.Namespace, engine_kwargs: dict) -> None:
    import uvicorn

    from gdserve.entrypoints.openai.draining import DrainingServer

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app, engine = build_server_app(args, engine_kwargs)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level)
    ctx = app.state.ctx
    note = _lora_note(list(ctx.models.lora_requests), _allow_runtime_lora(args, engine_kwargs["enable_lora"]))
    _say(f"serving {args.model} as '{ctx.served_model_name}' on http://{args.host}:{args.port}/v1 "
         f"(GET /health, /v1/models, /metrics){note}")
    DrainingServer(config, engine, SHUTDOWN_GRACE_S).run()


def build_server_app(args: argparse.Namespace, engine_kwargs: dict) -> tuple["FastAPI", "AsyncLLM"]:
    """The engine loaded as the flags say, and the app serving it (its LoRA modules read in)."""
    from gdserve.entrypoints.openai.app import build_app
    from gdserve.entrypoints.openai.serving_models import ServingModels

    chat_template = Path(args.chat_template).read_text() if args.chat_template else None
    allow_runtime_lora = _allow_runtime_lora(args, engine_kwargs["enable_lora"])
    engine = _load(args.model, engine_kwargs)
    name = args.served_model_name or args.model
    models = ServingModels(engine, name, args.model)
    try:
        asyncio.run(models.load_lora_modules(args.lora_modules or []))
    except BaseException:
        engine.shutdown()
        raise
    settle_gc()
    app = build_app(engine, name, args.api_key, args.max_queue, chat_template, _limits(args), args.allowed_origins,
                    models, allow_runtime_lora)
    return app, engine


def _lora_note(adapters: list[str], allow_runtime_lora: bool) -> str:
    note = f"; LoRA adapters {', '.join(adapters)}" if adapters else ""
    return note + ("; POST /v1/load_lora_adapter, /v1/unload_lora_adapter" if allow_runtime_lora else "")


def _allow_runtime_lora(args: argparse.Namespace, enable_lora: bool) -> bool:
    """Whether to add the load/unload routes; a ValueError for LoRA flags without --enable-lora."""
    if not enable_lora:
        for flag, given in (("--lora-modules", args.lora_modules), ("--allow-runtime-lora", args.allow_runtime_lora)):
            if given:
                raise ValueError(f"{flag} needs --enable-lora")
        return False
    return args.allow_runtime_lora or runtime_lora_from_env()


def _limits(args: argparse.Namespace) -> RequestLimits:
    return RequestLimits(max_request_bytes=args.max_request_bytes, max_n=args.max_n)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _comma_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _load(model: str, engine_kwargs: dict):
    from gdserve.engine.async_llm import AsyncLLM

    _say(f"loading {model} (a GGUF model is converted once into $GDSERVE_CACHE, ~15 s) ...")
    start = time.monotonic()
    done = threading.Event()
    ticker = threading.Thread(target=_tick, args=(done, start), daemon=True)
    ticker.start()
    try:
        engine = AsyncLLM(EngineConfig(model=model, **engine_kwargs))
    finally:
        done.set()
    core = engine.engine
    blocks, block_size = core.kv_cache.num_blocks, core.config.block_size
    _say(f"loaded in {time.monotonic() - start:.1f} s: {core.dtype} on {core.device}, "
         f"max_model_len {core.max_model_len}, KV cache {blocks * block_size} tokens "
         f"({blocks} blocks of {block_size}, {str(core.kv_cache_dtype).removeprefix('torch.')})")
    return engine


def _tick(done: threading.Event, start: float) -> None:
    while not done.wait(5.0):
        _say(f"  still loading ({time.monotonic() - start:.0f} s)")


def _say(message: str) -> None:
    print(f"gdserve: {message}", file=sys.stderr, flush=True)
