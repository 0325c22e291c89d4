"""gdserve.LLM built from `gdserve serve` flags, so one flag list configures both fixtures."""
import argparse

from gdserve.engine_args import add_engine_args, engine_kwargs


def make_llm(model: str | None, args: list[str]):
    from gdserve import LLM
    from gdserve.entrypoints.openai.server import add_serve_args
    parser = argparse.ArgumentParser(prog="gdserve serve", exit_on_error=False)
    add_serve_args(parser)  # accepted and ignored: serving flags are the server's alone
    add_engine_args(parser)
    try:
        parsed = parser.parse_args(args)
    except (argparse.ArgumentError, SystemExit) as e:
        raise ValueError(f"--gdserve-arg {' '.join(args)!r} are not `gdserve serve` flags: {e}") from None
    return LLM(model, **engine_kwargs(parsed)) if model else LLM(**engine_kwargs(parsed))
