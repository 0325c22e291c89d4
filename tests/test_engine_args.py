import argparse

import pytest

from gdserve.bench.throughput import add_throughput_parser
from gdserve.engine_args import add_engine_args, engine_kwargs


@pytest.mark.parametrize("flag", ["-tp", "--tensor-parallel-size"])
def test_tensor_parallel_size_reaches_the_engine(flag):
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert engine_kwargs(parser.parse_args([flag, "2"]))["tensor_parallel_size"] == 2
    assert engine_kwargs(parser.parse_args([]))["tensor_parallel_size"] == 1


def test_bench_throughput_takes_tp():
    parser = argparse.ArgumentParser()
    add_throughput_parser(parser.add_subparsers())
    args = parser.parse_args(["throughput", "-tp", "2"])
    assert engine_kwargs(args)["tensor_parallel_size"] == 2


def test_schedule_conservativeness_reaches_the_engine_and_a_negative_one_is_named():
    from gdserve.config import EngineConfig
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert engine_kwargs(parser.parse_args([]))["schedule_conservativeness"] == 1.0
    kwargs = engine_kwargs(parser.parse_args(["--schedule-conservativeness", "0"]))
    assert EngineConfig(**{**kwargs, "device": "cpu"}).schedule_conservativeness == 0.0
    with pytest.raises(ValueError, match="schedule_conservativeness must be >= 0"):
        EngineConfig(device="cpu", schedule_conservativeness=-0.5)


def test_fp8_attention_flag_reaches_the_engine():
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert engine_kwargs(parser.parse_args([]))["fp8_attention"] is False
    kwargs = engine_kwargs(parser.parse_args(["--kv-cache-dtype", "fp8", "--fp8-attention"]))
    assert kwargs["fp8_attention"] is True and kwargs["kv_cache_dtype"] == "fp8"
