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


def test_structured_outputs_under_vllms_names():
    """vLLM 0.12's StructuredOutputsParams and structured_outputs; its earlier GuidedDecodingParams
    and guided_decoding are the same class and field; a dict of the fields works too."""
    from gdserve import GuidedDecodingParams, StructuredOutputsParams
    assert GuidedDecodingParams is StructuredOutputsParams
    for params in (SamplingParams(structured_outputs=StructuredOutputsParams(regex="a+")),
                   SamplingParams(guided_decoding=GuidedDecodingParams(regex="a+")),
                   SamplingParams(structured_outputs={"regex": "a+"})):
        assert params.structured_outputs.spec == "a+" and params.guided_decoding is None
    with pytest.raises(ValueError, match="guided_decoding is structured_outputs"):
        SamplingParams(structured_outputs={"regex": "a"}, guided_decoding={"regex": "b"})
    with pytest.raises(ValueError, match="structured_outputs must be a StructuredOutputsParams"):
        SamplingParams(structured_outputs="a+")


def test_structured_outputs_json_options():
    from gdserve import StructuredOutputsParams
    tight = StructuredOutputsParams(json={"type": "object"}, disable_any_whitespace=True,
                                    disable_additional_properties=False, disable_fallback=True)
    assert tight.compile_options() == {"whitespace_pattern": "", "lenient": False, "open_objects": True}
    assert StructuredOutputsParams(json={}).compile_options()["open_objects"] is False
    for option in ({"disable_any_whitespace": True}, {"disable_additional_properties": True},
                   {"whitespace_pattern": " "}):
        with pytest.raises(ValueError, match="applies to json constraints only"):
            StructuredOutputsParams(regex="a", **option)
    with pytest.raises(ValueError, match="exclude each other"):
        StructuredOutputsParams(json={}, disable_any_whitespace=True, whitespace_pattern=" ")
    with pytest.raises(ValueError, match="structural_tag"):
        StructuredOutputsParams(json={}, structural_tag="{}")
