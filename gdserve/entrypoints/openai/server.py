"""`gdserve serve`: load the engine (printing progress), then run the app under uvicorn."""
import argparse
import logging
import sys
import threading
import time
from pathlib import Path

from gdserve.config import EngineConfig


def add_serve_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", help="require `Authorization: Bearer KEY` on /v1/*")
    parser.add_argument("--served-model-name", help="the model id clients send (default: MODEL)")
    parser.add_argument("--chat-template", help="a Jinja chat template file overriding the tokenizer's")
    parser.add_argument("--max-queue", type=int, help="answer 429 beyond this many waiting + running requests")
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])


def run_server(args: argparse.Namespace, engine_kwargs: dict) -> None:
    import uvicorn

    from gdserve.entrypoints.openai.app import build_app

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.max_queue is not None and args.max_queue < 1:
        raise ValueError(f"--max-queue must be >= 1, got {args.max_queue}")
    chat_template = Path(args.chat_template).read_text() if args.chat_template else None
    engine = _load(args.model, engine_kwargs)
    name = args.served_model_name or args.model
    app = build_app(engine, name, args.api_key, args.max_queue, chat_template)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            timeout_graceful_shutdown=5)
    _say(f"serving {args.model} as '{name}' on http://{args.host}:{args.port}/v1 "
         f"(GET /health, /v1/models, /metrics)")
    uvicorn.Server(config).run()


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
         f"({blocks} blocks of {block_size})")
    return engine


def _tick(done: threading.Event, start: float) -> None:
    while not done.wait(5.0):
        _say(f"  still loading ({time.monotonic() - start:.0f} s)")


def _say(message: str) -> None:
    print(f"gdserve: {message}", file=sys.stderr, flush=True)
