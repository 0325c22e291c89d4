"""A `serve run` config's args are `gdserve serve`'s flags, checked by the same parser."""
import pytest

from gdserve.entrypoints.ray_serve.options import parse_options


def test_options_become_the_flags_of_gdserve_serve():
    args = parse_options({"model": "/models/llama", "replicas": 3, "max_num_seqs": 64, "api_key": "k",
                          "enable_prefix_caching": False, "enforce_eager": True, "enable_lora": False,
                          "lora_modules": ["a=/x", {"name": "b", "path": "/y"}], "max_queue": None})
    assert (args.model, args.replicas, args.max_num_seqs, args.api_key) == ("/models/llama", 3, 64, "k")
    assert args.enable_prefix_caching is False and args.enforce_eager and not args.enable_lora
    assert [m.name for m in args.lora_modules] == ["a", "b"] and args.max_queue is None
    assert args.ray and args.port == 8000  # defaults as the command's


def test_an_unknown_or_bad_option_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match="max-num-sqs"):
        parse_options({"max_num_sqs": 1})
    with pytest.raises(ValueError, match="max-num-seqs"):
        parse_options({"max_num_seqs": "many"})
