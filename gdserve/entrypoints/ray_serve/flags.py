"""The Ray Serve flags of `gdserve serve`. Nothing here imports ray: `gdserve serve --help` loads without it."""
import argparse

# Characters of a request's prompt (after its model name) that pick its replica: requests that agree
# on them go to the same replica, whose prefix cache then holds their common start.
DEFAULT_PREFIX_CHARS = 256
# A request leaves its prefix's replica when that replica has this many more requests queued or
# running than the least loaded one.
DEFAULT_IMBALANCED_THRESHOLD = 8


def add_ray_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ray", action="store_true",
                        help="serve data-parallel engine replicas on Ray Serve (pip install gdserve[ray])")
    parser.add_argument("--replicas", type=int, help="engine replicas, each a full copy of the model (with --ray; "
                                                     "default 1)")
    parser.add_argument("--ray-address", help="the Ray cluster to join, e.g. ray://head:10001 or auto (with --ray; "
                                              "default: start a local one)")
    parser.add_argument("--ray-prefix-chars", type=int, default=DEFAULT_PREFIX_CHARS,
                        help="requests whose prompts agree on this many first characters go to the same replica "
                             "(with --ray; 0: every request to the least loaded replica)")
    parser.add_argument("--ray-imbalanced-threshold", type=int, default=DEFAULT_IMBALANCED_THRESHOLD,
                        help="a request goes to the least loaded replica instead of its prefix's when that one "
                             "has this many more requests in flight (with --ray)")


def check_ray_args(args: argparse.Namespace) -> None:
    """A ValueError naming the first Ray flag that does not fit the others."""
    if not args.ray:
        for flag, given in (("--replicas", args.replicas), ("--ray-address", args.ray_address)):
            if given is not None:
                raise ValueError(f"{flag} needs --ray (data-parallel replicas run on Ray Serve)")
        return
    if args.replicas is not None and args.replicas < 1:
        raise ValueError(f"--replicas must be >= 1, got {args.replicas}")
    if args.ray_prefix_chars < 0 or args.ray_imbalanced_threshold < 0:
        raise ValueError("--ray-prefix-chars and --ray-imbalanced-threshold must be >= 0")
    if args.allow_runtime_lora:
        raise ValueError("--allow-runtime-lora is not supported with --ray: an adapter loaded at runtime would "
                         "reach one replica only (use --lora-modules)")
