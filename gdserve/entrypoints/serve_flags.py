"""The flags of `gdserve serve`, shared by the CLI and the options of a Ray Serve config file."""
import argparse

from gdserve.engine_args import add_engine_args
from gdserve.entrypoints.openai.server import add_serve_args
from gdserve.entrypoints.ray_serve.flags import add_ray_args
from gdserve.models.registry import DEFAULT_MODEL


def add_serve_command_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    add_serve_args(parser)
    add_engine_args(parser)
    add_ray_args(parser)
