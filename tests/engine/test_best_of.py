"""best_of: candidates generated, the n of highest cumulative logprob returned."""
import re

import pytest

from gdserve import LLM, SamplingParams
from gdserve.sampling_params import StructuredOutputsParams

PROMPT = {"prompt_token_ids": [5, 17, 42, 9, 88, 3]}


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    return LLM(str(tiny_llama_dir), dtype="float32", kv_cache_memory=1 << 22, block_size=4)


def top_n(candidates, n):
    return sorted(candidates, key=lambda c: c.cumulative_logprob, reverse=True)[:n]


@pytest.mark.parametrize("guided", [None, StructuredOutputsParams(regex=r"[0-9]{2,6}")])
def test_best_of_returns_the_top_n_candidates(llm, guided):
    """The same seed with n=best_of generates the same candidates: best_of returns its top n."""
    common = dict(max_tokens=8, temperature=1.0, seed=11, structured_outputs=guided, ignore_eos=guided is None)
    everyone = llm.generate(PROMPT, SamplingParams(n=4, logprobs=0, **common))[0]
    best = llm.generate(PROMPT, SamplingParams(n=2, best_of=4, **common))[0]
    expected = top_n(everyone.outputs, 2)
    assert [c.index for c in best.outputs] == [0, 1]
    assert [c.token_ids for c in best.outputs] == [c.token_ids for c in expected]
    assert [c.cumulative_logprob for c in best.outputs] == pytest.approx([c.cumulative_logprob for c in expected])
    assert best.outputs[0].cumulative_logprob >= best.outputs[1].cumulative_logprob
    assert best.outputs[0].logprobs is None  # not asked for
    assert best.num_generated_tokens == everyone.num_generated_tokens  # every candidate counts
    if guided is not None:
        assert all(re.fullmatch(guided.regex, c.text) for c in everyone.outputs + best.outputs)


def test_best_of_with_logprobs_returns_them_per_token(llm):
    out = llm.generate(PROMPT, SamplingParams(n=1, best_of=3, max_tokens=5, seed=3, logprobs=2,
                                              ignore_eos=True))[0]
    (c,) = out.outputs
    assert len(c.logprobs) == 5 and c.token_ids[0] in c.logprobs[0]
    assert c.cumulative_logprob == pytest.approx(sum(lp[t] for lp, t in zip(c.logprobs, c.token_ids)))
    assert out.num_generated_tokens == 15


def test_best_of_streams_nothing_until_ranked(llm):
    """A cumulative request ranking candidates reports once, when every candidate has finished."""
    engine = llm.engine
    request_id = engine.add_request([5, 6, 7], SamplingParams(n=1, best_of=2, max_tokens=4, ignore_eos=True))
    outputs = []
    while engine.has_unfinished_requests():
        outputs += [o for o in engine.step() if o.request_id == request_id]
    assert len(outputs) == 1 and outputs[0].finished and len(outputs[0].outputs) == 1


def test_best_of_defaults_to_n():
    assert SamplingParams(n=3).best_of == 3
    assert SamplingParams(n=2, best_of=5).best_of == 5
