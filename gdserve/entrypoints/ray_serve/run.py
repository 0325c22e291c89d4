"""`gdserve serve --ray`: join (or start) a Ray cluster, run the application on Ray Serve's HTTP proxy
at --host:--port, and keep it up until SIGTERM or SIGINT."""
import argparse
import signal
import sys
import threading

import ray
from ray import serve

from gdserve.entrypoints.ray_serve.app import application

APP_NAME = "gdserve"


def run_ray_server(args: argparse.Namespace, engine_kwargs: dict) -> None:
    ray.init(address=args.ray_address, include_dashboard=False, logging_level=args.log_level.upper())
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        _say(f"starting {args.replicas or 1} replica(s) of {args.model} on Ray Serve ...")
        serve.run(application(args, engine_kwargs), name=APP_NAME, route_prefix="/")
        _say(f"serving {args.model} on http://{args.host}:{args.port}/v1 with {args.replicas or 1} replica(s)")
        _wait_for_signal()
        serve.delete(APP_NAME)
    finally:
        ray.shutdown()


def _wait_for_signal() -> None:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass


def _say(message: str) -> None:
    print(f"gdserve: {message}", file=sys.stderr, flush=True)
