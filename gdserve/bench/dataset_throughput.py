"""`gdserve bench throughput --dataset-name ...`: vLLM's `bench throughput` on the engine: the
dataset's requests in one batch, each sampled (temperature 1.0, EOS ignored) to its max_tokens;
requests/s, total tokens/s and output tokens/s under vLLM's JSON field names."""
import argparse
import sys
from dataclasses import asdict, dataclass

from gdserve.bench.datasets.args import DatasetSpec, sample_requests
from gdserve.bench.datasets.sample import SampleRequest
from gdserve.bench.offline import timed_generate, warm_llm
from gdserve.bench.results import run_header, write_result
from gdserve.config import EngineConfig


@dataclass(frozen=True)
class DatasetThroughput:
    elapsed_time: float
    num_requests: int
    total_prompt_tokens: int
    total_output_tokens: int
    max_num_seqs: int  # the engine's seats, as given or as sized from its KV cache

    def fields(self) -> dict:
        """vLLM's fields (elapsed_time ... tokens_per_second), then the token counts, output tokens/s
        and the seats."""
        total = self.total_prompt_tokens + self.total_output_tokens
        return {"elapsed_time": self.elapsed_time, "num_requests": self.num_requests, "total_num_tokens": total,
                "requests_per_second": self.num_requests / self.elapsed_time,
                "tokens_per_second": total / self.elapsed_time,
                "total_prompt_tokens": self.total_prompt_tokens, "total_output_tokens": self.total_output_tokens,
                "output_tokens_per_second": self.total_output_tokens / self.elapsed_time,
                "max_num_seqs": self.max_num_seqs}


def engine_inputs(requests: list[SampleRequest]) -> tuple[list[dict], list]:
    """The prompts and sampling parameters of vLLM's throughput run: temperature 1.0, EOS ignored."""
    from gdserve import SamplingParams
    prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in requests]
    params = [SamplingParams(temperature=1.0, top_p=1.0, ignore_eos=True, max_tokens=r.expected_output_len)
              for r in requests]
    return prompts, params


def measure(llm, requests: list[SampleRequest]) -> DatasetThroughput:
    """The requests timed in one generate call on a warmed engine (a progress bar on a terminal)."""
    run, outputs = timed_generate(llm, *engine_inputs(requests))
    return DatasetThroughput(run["seconds"], len(outputs), sum(o.num_prompt_tokens for o in outputs),
                             sum(o.num_generated_tokens for o in outputs), llm.engine.config.max_num_seqs)


def run_requests(requests: list[SampleRequest], model: str, engine_args: dict) -> DatasetThroughput:
    """The engine, warmed, then measure."""
    llm = warm_llm(model, engine_args, engine_inputs(requests)[0])
    try:
        return measure(llm, requests)
    finally:
        llm.engine.close()


def print_throughput(r: dict) -> None:
    print(f"Throughput: {r['requests_per_second']:.2f} requests/s, {r['tokens_per_second']:.2f} total tokens/s, "
          f"{r['output_tokens_per_second']:.2f} output tokens/s")
    print(f"Total num prompt tokens:  {r['total_prompt_tokens']}")
    print(f"Total num output tokens:  {r['total_output_tokens']}")


def bench_dataset(args: argparse.Namespace, spec: DatasetSpec, engine_args: dict) -> None:
    """Sample the dataset with the engine's tokenizer, run it, print and write the figures."""
    from gdserve.models.loader import load_tokenizer, resolve_model
    tokenizer = load_tokenizer(resolve_model(engine_args.get("tokenizer") or args.model))
    requests = sample_requests(spec, tokenizer)
    result = run_header(args, EngineConfig(model=args.model, **engine_args), len(requests))
    result["dataset"] = asdict(spec)
    print(f"engine: {len(requests)} requests of the {spec.dataset_name} dataset ...", file=sys.stderr, flush=True)
    result.update(run_requests(requests, args.model, engine_args).fields())
    print_throughput(result)
    write_result(result, args.output)
