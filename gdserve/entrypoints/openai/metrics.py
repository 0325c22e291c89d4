"""Prometheus metrics (`GET /metrics`): engine gauges read at scrape time, request counters and
latency histograms recorded by the handlers."""
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST  # noqa: F401  (re-exported for app.py)

from gdserve.engine.async_llm import AsyncLLM
from gdserve.outputs import RequestOutput

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_TOKEN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5, 5)


class Metrics:
    def __init__(self, engine: AsyncLLM, model_name: str):
        self.registry = r = CollectorRegistry()
        labels = {"model_name": model_name}
        stats = lambda: engine.stats  # noqa: E731  (a snapshot the engine thread refreshes)
        gauges = {
            "num_requests_running": ("Sequences in the running batch", lambda: stats().num_running),
            "num_requests_waiting": ("Sequences waiting to be scheduled", lambda: stats().num_waiting),
            "kv_cache_usage_perc": ("Share of KV cache blocks in use (0-1)", lambda: stats().kv_cache_usage),
            "kv_cache_used_blocks": ("KV cache blocks held by sequences", lambda: stats().num_used_blocks),
            "kv_cache_total_blocks": ("KV cache blocks", lambda: stats().num_blocks),
            "prefix_cache_hit_rate": ("Prompt tokens found in the prefix cache / looked up",
                                      lambda: stats().prefix_cache_hit_rate),
            "num_preemptions": ("Sequences preempted so far", lambda: stats().num_preemptions),
            "num_requests_swapped": ("Sequences swapped out to CPU memory", lambda: stats().num_swapped),
            "cpu_cache_usage_perc": ("Share of swap space blocks in use (0-1)", lambda: stats().cpu_cache_usage),
        }
        for name, (doc, fn) in gauges.items():
            Gauge(f"gdserve_{name}", doc, list(labels), registry=r).labels(**labels).set_function(fn)
        self.prompt_tokens = _counter(r, "prompt_tokens", "Prompt tokens processed", labels)
        self.generation_tokens = _counter(r, "generation_tokens", "Tokens generated", labels)
        self.requests = Counter("gdserve_request_success", "Finished requests by finish_reason",
                                ["model_name", "finish_reason"], registry=r)
        self.labels = labels
        self.ttft = _histogram(r, "time_to_first_token_seconds", "Time to first token", labels, _LATENCY_BUCKETS)
        self.itl = _histogram(r, "inter_token_latency_seconds", "Time between output tokens", labels, _TOKEN_BUCKETS)
        self.e2e = _histogram(r, "e2e_request_latency_seconds", "Request latency", labels, _LATENCY_BUCKETS)
        self.compile_time = _histogram(r, "grammar_compile_seconds", "Constraint compile wait", labels,
                                       _LATENCY_BUCKETS)
        self.compile_cache_hits = _counter(r, "grammar_compile_cache_hits", "Constraints found compiled", labels)
        self.compile_requests = _counter(r, "grammar_compile_requests", "Constraints submitted", labels)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def observe_compile(self, seconds: float, cache_hit: bool) -> None:
        self.compile_requests.inc()
        if cache_hit:
            self.compile_cache_hits.inc()
        else:
            self.compile_time.observe(seconds)


class RequestTimer:
    """Latency of one engine request, fed its cumulative outputs."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics
        self.start = self.last = time.monotonic()
        self.num_tokens = 0

    def update(self, out: RequestOutput) -> None:
        now = time.monotonic()
        num_tokens = out.num_generated_tokens
        new = num_tokens - self.num_tokens
        if new > 0:
            if self.num_tokens == 0:
                self.metrics.ttft.observe(now - self.start)
            else:
                self.metrics.itl.observe((now - self.last) / new)
            self.num_tokens, self.last = num_tokens, now
        if out.finished:
            m = self.metrics
            m.e2e.observe(now - self.start)
            m.prompt_tokens.inc(out.num_prompt_tokens)
            m.generation_tokens.inc(num_tokens)
            for c in out.outputs:
                m.requests.labels(model_name=m.labels["model_name"], finish_reason=c.finish_reason).inc()


def _counter(registry, name: str, doc: str, labels: dict) -> Counter:
    return Counter(f"gdserve_{name}", doc, list(labels), registry=registry).labels(**labels)


def _histogram(registry, name: str, doc: str, labels: dict, buckets) -> Histogram:
    return Histogram(f"gdserve_{name}", doc, list(labels), buckets=buckets, registry=registry).labels(**labels)
