"""The Ray Serve application: N engine replicas behind one ingress, routed with prefix affinity.
`application` builds it from `gdserve serve`'s flags; `build_app` is the builder a `serve run`
config file names (docs/replicas.md, examples/ray_serve_config.yaml)."""
import argparse

import ray
from ray import serve
from ray.serve import Application
from ray.serve.config import RequestRouterConfig

from gdserve.engine_args import engine_kwargs
from gdserve.entrypoints.ray_serve.flags import check_ray_args
from gdserve.entrypoints.ray_serve.ingress import Ingress
from gdserve.entrypoints.ray_serve.options import parse_options
from gdserve.entrypoints.ray_serve.replica import EngineReplica
from gdserve.entrypoints.ray_serve.router import PrefixAffinityRouter

# Requests one replica takes at once; more wait in the ingress's router. gdserve's own --max-queue
# still answers 429 beyond its limit.
MAX_ONGOING_REQUESTS = 256


def application(args: argparse.Namespace, kwargs: dict | None = None) -> Application:
    """The application of `gdserve serve --ray` with these flags (engine_kwargs from them unless given)."""
    kwargs = engine_kwargs(args) if kwargs is None else kwargs
    router = RequestRouterConfig(request_router_class=PrefixAffinityRouter,
                                 request_router_kwargs={"imbalanced_threshold": args.ray_imbalanced_threshold})
    replica = serve.deployment(EngineReplica, name="EngineReplica").options(
        num_replicas=args.replicas or 1, max_ongoing_requests=MAX_ONGOING_REQUESTS,
        ray_actor_options={"num_cpus": 1, "num_gpus": _replica_gpus(args.device)},
        request_router_config=router, health_check_period_s=5, health_check_timeout_s=30)
    ingress = serve.deployment(Ingress, name="Ingress").options(
        ray_actor_options={"num_cpus": 0}, max_ongoing_requests=MAX_ONGOING_REQUESTS * (args.replicas or 1))
    return ingress.bind(replica.bind(args, kwargs), args.api_key, args.max_request_bytes, args.allowed_origins,
                        args.ray_prefix_chars)


def build_app(options: dict) -> Application:
    """The builder for `serve run`: options are `gdserve serve`'s flags by name (max_num_seqs: 64,
    enable_prefix_caching: false, lora_modules: [...]); `model` is the model."""
    args = parse_options(options)
    check_ray_args(args)
    return application(args)


def _replica_gpus(device: str) -> float:
    """A GPU per replica on CUDA; with --device auto, wherever the cluster has GPUs."""
    if device.startswith("cuda"):
        return 1
    if device == "auto" and ray.is_initialized():
        return 1 if ray.cluster_resources().get("GPU", 0) > 0 else 0
    return 0
