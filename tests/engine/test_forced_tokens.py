"""Forced text through the engine (enable_forced_tokens): the tokens a constraint forces are
appended without a decode step each and prefilled by the next step; outputs stay valid, and
stop strings, max_tokens, logprobs, n / best_of, async scheduling and preemption stay right."""
import json

import jsonschema
import pytest

from gdserve import LLM, SamplingParams
from gdserve.sampling_params import StructuredOutputsParams
from tests.engine.test_llm import assert_no_leaks
from tests.engine.test_swap import block_bytes
from tests.helpers import chat_ids

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city", "member"],
          "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer"},
                         "city": {"enum": ["Paris", "London", "Tokyo"]}, "member": {"type": "boolean"}}}
SENTENCE = "The answer to the question is forty-two"


def _llm(smollm2_dir, **kw) -> LLM:
    return LLM(str(smollm2_dir), dtype="float32", kv_cache_memory=256 << 20, **{"enable_forced_tokens": True, **kw})


@pytest.fixture(scope="module")
def llm(smollm2_dir):
    llm = _llm(smollm2_dir)
    yield llm
    llm.engine.close()


@pytest.fixture(scope="module")
def llm_off(smollm2_dir):
    llm = _llm(smollm2_dir, enable_forced_tokens=False)
    yield llm
    llm.engine.close()


def person(max_tokens=96, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=kw.pop("temperature", 0.0),
                          structured_outputs=StructuredOutputsParams(json=PERSON, disable_any_whitespace=True), **kw)


def _prompt(llm, i: int = 0) -> dict:
    return chat_ids(llm, f"Describe person number {i} as JSON with name, age, city and member.")


def _run_counting_steps(llm: LLM, prompt: dict, params: SamplingParams):
    """The request's output and the engine steps it took once its grammar compiled."""
    engine = llm.engine
    request_id = engine.add_request(prompt["prompt_token_ids"], params)
    steps, final = 0, None
    while engine.has_unfinished_requests():
        final = next((o for o in engine.step() if o.request_id == request_id and o.finished), final)
        steps += request_id not in engine.compiling
    return final, steps


def test_forced_tokens_take_no_decode_step(llm, llm_off):
    """Every output token is either sampled in a step of its own or forced: the steps number the
    sampled ones. The output validates; without forced text each token takes a step."""
    out, steps = _run_counting_steps(llm, _prompt(llm), person())
    completion = out.outputs[0]
    jsonschema.validate(json.loads(completion.text), PERSON)
    assert completion.num_forced_tokens >= 4  # keys and punctuation at least
    assert steps == len(completion.token_ids) - completion.num_forced_tokens
    off, off_steps = _run_counting_steps(llm_off, _prompt(llm_off), person())
    jsonschema.validate(json.loads(off.outputs[0].text), PERSON)
    assert off.outputs[0].num_forced_tokens == 0 and off_steps == len(off.outputs[0].token_ids)
    assert_no_leaks(llm)


def test_a_wholly_forced_output_is_taken_at_admission(llm):
    """The constraint's whole text is forced from its start: it is appended before the prompt's
    prefill, whose step samples EOS."""
    params = SamplingParams(max_tokens=32, structured_outputs=StructuredOutputsParams(regex=SENTENCE))
    out, steps = _run_counting_steps(llm, _prompt(llm), params)
    completion = out.outputs[0]
    assert completion.text == SENTENCE and completion.finish_reason == "stop"
    assert steps == 1 and completion.num_forced_tokens == len(completion.token_ids) - 1  # and EOS
    assert completion.token_ids[-1] in llm.engine.eos_token_ids


def test_a_stop_string_inside_forced_text_ends_the_output_there(llm):
    """Forced at admission and cut by the stop string: the request finishes without a step of
    its own and is reported by the next one."""
    params = SamplingParams(max_tokens=32, stop=["question"],
                            structured_outputs=StructuredOutputsParams(regex=SENTENCE))
    outs = llm.generate([_prompt(llm)], params)
    completion = outs[0].outputs[0]
    assert completion.text == "The answer to the " and completion.finish_reason == "stop"
    assert completion.stop_reason == "question"
    assert_no_leaks(llm)


def test_forced_text_that_ends_inside_a_character_stays_whole(llm):
    """The choices share "Ελληνικά " and a first byte after it (κ and λ are 0xCE 0xBA / 0xCE
    0xBB): the forced bytes end inside a character. The text comes out whole, streamed or not."""
    choices = ["Ελληνικά κείμενο", "Ελληνικά λέξη"]
    params = SamplingParams(max_tokens=32, structured_outputs=StructuredOutputsParams(choice=choices))
    engine = llm.engine
    request_id = engine.add_request(_prompt(llm)["prompt_token_ids"], params)
    texts = []
    while engine.has_unfinished_requests():
        texts += [o.outputs[0].text for o in engine.step() if o.request_id == request_id]
    final = texts[-1]
    assert final in choices and all(final.startswith(t) and "\ufffd" not in t for t in texts)
    assert llm.generate([_prompt(llm)], params)[0].outputs[0].num_forced_tokens > 0


def test_requests_that_ask_for_logprobs_decode_every_token(llm):
    """Their every token has the model's logprob: none is forced."""
    outs = llm.generate([_prompt(llm)], person(logprobs=2))
    completion = outs[0].outputs[0]
    jsonschema.validate(json.loads(completion.text), PERSON)
    assert completion.num_forced_tokens == 0
    assert len(completion.logprobs) == len(completion.token_ids)
    ranked = llm.generate([_prompt(llm)], person(temperature=1.0, seed=3, n=1, best_of=3))
    assert ranked[0].outputs[0].num_forced_tokens == 0  # best_of ranks by cumulative logprob


def test_parallel_samples_each_take_their_forced_text(llm):
    outs = llm.generate([_prompt(llm, 1)], person(temperature=1.0, seed=5, n=3))
    completions = outs[0].outputs
    assert len(completions) == 3
    for completion in completions:
        jsonschema.validate(json.loads(completion.text), PERSON)
        assert completion.num_forced_tokens > 0
    assert_no_leaks(llm)


def test_async_scheduling_takes_the_same_tokens(smollm2_dir, llm):
    """With async scheduling a step is already running when the forced text is known: that
    sequence's row of it is left out of the sample, and the next step prefills the forced
    tokens. Same tokens as the synchronous engine's."""
    prompts = [_prompt(llm, i) for i in range(4)]
    expected = llm.generate(prompts, person())
    overlapped = _llm(smollm2_dir, async_scheduling=True)
    try:
        got = overlapped.generate(prompts, person())
        for a, b in zip(expected, got):
            assert a.outputs[0].token_ids == b.outputs[0].token_ids
            assert a.outputs[0].num_forced_tokens == b.outputs[0].num_forced_tokens > 0
        assert_no_leaks(overlapped)
    finally:
        overlapped.engine.close()


@pytest.mark.parametrize("preemption_mode", ["recompute", "swap"])
def test_preempted_sequences_keep_their_forced_tokens(smollm2_dir, llm, preemption_mode):
    """A cache too small for the batch preempts sequences holding forced tokens, and a small token
    budget splits their chunks: the outputs are those of an engine that does neither."""
    prompts = [_prompt(llm, i) for i in range(6)]
    expected = llm.generate(prompts, person())
    per_block = block_bytes(smollm2_dir)
    small = LLM(str(smollm2_dir), dtype="float32", block_size=4, max_num_batched_tokens=32, max_model_len=160,
                kv_cache_memory=48 * per_block, swap_space=64 * per_block / (1 << 30),
                preemption_mode=preemption_mode, schedule_conservativeness=0, enable_forced_tokens=True)
    try:
        got = small.generate(prompts, person())
        assert small.engine.scheduler.num_preemptions > 0
        assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in expected]
        assert_no_leaks(small)
    finally:
        small.engine.close()
