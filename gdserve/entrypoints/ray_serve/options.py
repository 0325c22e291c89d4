"""A `serve run` config's application args as `gdserve serve` flags, parsed by the same parser, so a
config file takes exactly the flags the command does, with the same defaults and checks."""
import argparse
import json

from gdserve.entrypoints.serve_flags import add_serve_command_args


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise ValueError(f"Ray Serve config args: {message}")


def parse_options(options: dict) -> argparse.Namespace:
    parser = _Parser(prog="gdserve serve")
    add_serve_command_args(parser)
    args = parser.parse_args(to_argv(options, parser))
    args.ray = True
    return args


def to_argv(options: dict, parser: argparse.ArgumentParser) -> list[str]:
    """model: the positional; true: the bare flag; false: its --no- form where it has one; a list:
    the flag and each value (a dict as JSON: a --lora-modules entry)."""
    options = dict(options)
    argv = [str(options.pop("model"))] if "model" in options else []
    known = {s for action in parser._actions for s in action.option_strings}
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is None or value is False and f"--no-{flag[2:]}" not in known:
            continue
        if isinstance(value, bool):
            argv.append(flag if value else f"--no-{flag[2:]}")
        elif isinstance(value, list):
            argv += [flag, *(json.dumps(v) if isinstance(v, dict) else str(v) for v in value)]
        else:
            argv += [flag, str(value)]
    return argv
