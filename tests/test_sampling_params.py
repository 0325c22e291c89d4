import dataclasses

import pytest

from gdserve.sampling_params import SamplingParams


def test_defaults_match_vllm():
    p = SamplingParams()
    assert (p.n, p.max_tokens, p.temperature, p.top_p, p.top_k, p.min_p) == (1, 16, 1.0, 1.0, 0, 0.0)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert p.logit_bias is None and p.seed is None and p.logprobs is None
    assert p.stop == [] and p.stop_token_ids == []
    assert not p.include_stop_str_in_output and not p.ignore_eos
    assert p.min_tokens == 0 and p.skip_special_tokens


def test_normalization():
    assert SamplingParams(stop="###").stop == ["###"]
    assert SamplingParams(stop=("a", "b")).stop == ["a", "b"]
    assert SamplingParams(top_k=-1).top_k == 0
    assert SamplingParams(logit_bias={"42": 5, 7: -1.5}).logit_bias == {42: 5.0, 7: -1.5}
    assert SamplingParams(max_tokens=None).max_tokens is None


@pytest.mark.parametrize("field, value, accepted", [
    ("n", 0, ">= 1"),
    ("max_tokens", 0, ">= 1"),
    ("temperature", -0.1, ">= 0"),
    ("top_p", 0.0, "(0, 1]"),
    ("top_p", 1.5, "(0, 1]"),
    ("top_k", -2, "-1, 0 (off)"),
    ("min_p", 1.1, "[0, 1]"),
    ("presence_penalty", 2.5, "[-2, 2]"),
    ("frequency_penalty", -3, "[-2, 2]"),
    ("repetition_penalty", 0.0, "> 0"),
    ("min_tokens", -1, ">= 0"),
    ("logprobs", 21, "[0, 20]"),
    ("logprobs", -1, "[0, 20]"),
    ("stop", ["ok", ""], "non-empty"),
    ("stop", "", "non-empty"),
    ("stop_token_ids", [-1], "non-negative"),
    ("seed", 2**63, "64-bit"),
    ("seed", -2**63 - 1, "64-bit"),
])
def test_out_of_range_names_field_and_range(field, value, accepted):
    with pytest.raises(ValueError) as e:
        SamplingParams(**{field: value})
    assert field in str(e.value) and accepted in str(e.value)


def test_min_tokens_at_most_max_tokens():
    with pytest.raises(ValueError, match=r"min_tokens must be <= max_tokens \(4\)"):
        SamplingParams(max_tokens=4, min_tokens=5)
    assert SamplingParams(max_tokens=None, min_tokens=100).min_tokens == 100


def test_logit_bias_validation():
    with pytest.raises(ValueError, match=r"logit_bias\[3\] must be in \[-100, 100\]"):
        SamplingParams(logit_bias={"3": 101})
    with pytest.raises(ValueError, match="logit_bias keys"):
        SamplingParams(logit_bias={"abc": 1})
    with pytest.raises(ValueError, match="logit_bias keys"):
        SamplingParams(logit_bias={-4: 1})


def test_unknown_field_is_value_error_listing_accepted():
    with pytest.raises(ValueError) as e:
        SamplingParams(temprature=0.5)
    msg = str(e.value)
    assert "temprature" in msg
    assert all(f.name in msg for f in dataclasses.fields(SamplingParams))


def test_replace_keeps_validation():
    p = dataclasses.replace(SamplingParams(stop="x"), temperature=0.0)
    assert p.temperature == 0.0 and p.stop == ["x"]
    with pytest.raises(ValueError, match="temperature"):
        dataclasses.replace(p, temperature=-1.0)


@pytest.mark.parametrize("best_of", [2, 3.5, "4"])
def test_best_of_below_n_or_not_an_integer_is_rejected(best_of):
    with pytest.raises(ValueError, match=r"best_of must be an integer >= n \(3\), got"):
        SamplingParams(n=3, best_of=best_of)
