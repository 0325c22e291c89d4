"""Guided decoding through the engine with the default model: every output obeys its constraint,
guided and unguided requests share batches without changing each other's tokens."""
import gc
import json
import re
from pathlib import Path

import jsonschema
import pytest

from gdserve import LLM, SamplingParams
from gdserve.engine.guided import STEP_ALLOWANCE_S
from gdserve.grammar import GrammarError
from gdserve.sampling_params import StructuredOutputsParams
from tests.engine.test_llm import assert_no_leaks
from tests.grammar.slow_grammar import UNIT_S, SlowRowGrammar
from tests.helpers import chat_ids

SCHEMAS_DIR = Path(__file__).resolve().parents[2] / "schemas"
SCHEMA_FILES = sorted(SCHEMAS_DIR.glob("*.json"))
# A spread of shapes through the engine (the compiler itself is tested on every file in
# tests/grammar): nesting, $ref, formats, enums, nullable, numeric ranges, tuples, oneOf.
ENGINE_SCHEMAS = ["person", "invoice", "order_line_items", "calendar_event", "address_refs",
                  "github_issue", "k8s_container", "openai_function_args", "nullable_fields",
                  "numeric_ranges", "tuple_prefix_items", "oneof_discriminator"]


@pytest.fixture(scope="module")
def llm(smollm2_dir):
    llm = LLM(str(smollm2_dir), dtype="float32", kv_cache_memory=512 << 20)
    yield llm
    llm.engine.close()


def json_params(schema, max_tokens=384, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0,
                          structured_outputs=StructuredOutputsParams(json=schema), **kw)


def schema_prompt(name: str, schema: dict) -> str:
    about = schema.get("description") or schema.get("title") or name.replace("_", " ")
    return f"Write a realistic JSON example of: {about}. Answer with JSON only."


def test_schema_generations_validate(llm):
    """One batch holding a generation per schema: every output completes (the engine steers
    unbounded strings and arrays to a close before max_tokens) and validates."""
    assert len(SCHEMA_FILES) >= 30, "schemas/ should hold the real-world test schemas"
    files = [SCHEMAS_DIR / f"{name}.json" for name in ENGINE_SCHEMAS]
    schemas = [json.loads(f.read_text()) for f in files]
    prompts = [chat_ids(llm, schema_prompt(f.stem, s)) for f, s in zip(files, schemas)]
    outs = llm.generate(prompts, [json_params(s, 256) for s in schemas])
    for f, schema, out in zip(files, schemas, outs):
        completion = out.outputs[0]
        assert completion.finish_reason == "stop", f.name
        jsonschema.Draft202012Validator(schema).validate(json.loads(completion.text))
    assert_no_leaks(llm)


def test_unbounded_strings_close_before_max_tokens(llm):
    schema = {"type": "object", "properties": {"story": {"type": "string"},
                                               "tags": {"type": "array", "items": {"type": "string"}}},
              "required": ["story", "tags"]}
    prompt = chat_ids(llm, "Write a very long fairy tale, as JSON with a story and many tags.")
    for max_tokens in (16, 24, 40):
        completion = llm.generate(prompt, json_params(schema, max_tokens))[0].outputs[0]
        assert completion.finish_reason == "stop" and len(completion.token_ids) <= max_tokens
        jsonschema.Draft202012Validator(schema).validate(json.loads(completion.text))


@pytest.mark.parametrize("pattern,prompt", [
    (r"[0-9]{3}-[0-9]{3}-[0-9]{4}", "Give me a US phone number."),
    (r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])", "When did the Apollo 11 landing happen?"),
    (r"[a-z]+@[a-z]+\.(com|org)", "Make up an email address."),
    (r"(yes|no), because [a-z ,]{10,60}\.", "Is the sky blue? Explain briefly."),
])
def test_regex_outputs_fullmatch(llm, pattern, prompt):
    out = llm.generate(chat_ids(llm, prompt), SamplingParams(max_tokens=64, temperature=0.0,
                                                             structured_outputs=StructuredOutputsParams(regex=pattern)))[0]
    assert re.fullmatch(pattern, out.outputs[0].text), out.outputs[0].text
    assert out.outputs[0].finish_reason == "stop"


def test_choice_outputs_are_in_the_list_also_when_sampled(llm):
    choices = ["positive", "negative", "neutral", "it's complicated (see notes)"]
    params = SamplingParams(max_tokens=16, temperature=1.2, seed=3, n=4,
                            structured_outputs=StructuredOutputsParams(choice=choices))
    out = llm.generate(chat_ids(llm, "Classify the sentiment: 'I loved this movie!'"), params)[0]
    assert len(out.outputs) == 4
    assert all(o.text in choices and o.finish_reason == "stop" for o in out.outputs)
    assert_no_leaks(llm)


def test_mixed_batch_gives_each_request_its_solo_output(llm):
    schema = json.loads((SCHEMAS_DIR / SCHEMA_FILES[0].name).read_text())
    requests = []
    for i in range(8):  # two of each guided kind and four unguided, interleaved
        if i % 4 == 0:
            requests.append((chat_ids(llm, f"Example {i}: {schema_prompt('x', schema)}"), json_params(schema, 96)))
        elif i % 4 == 1:
            requests.append((chat_ids(llm, f"Pick a number {i}"),
                             SamplingParams(max_tokens=8, temperature=0.0,
                                            structured_outputs=StructuredOutputsParams(regex=r"[0-9]{1,4}"))))
        else:
            requests.append((chat_ids(llm, f"Tell me fact number {i} about cats."),
                             SamplingParams(max_tokens=24, temperature=0.0)))
    together = llm.generate([r[0] for r in requests], [r[1] for r in requests])
    for (prompt, params), out in zip(requests, together):
        alone = llm.generate(prompt, params)[0]
        assert alone.outputs[0].token_ids == out.outputs[0].token_ids
    assert_no_leaks(llm)


def test_bad_constraint_raises_naming_the_problem_and_others_still_run(llm):
    with pytest.raises(GrammarError):
        llm.generate(chat_ids(llm, "hi"), SamplingParams(structured_outputs=StructuredOutputsParams(regex="(?<=a)b")))
    with pytest.raises(GrammarError):
        llm.generate(chat_ids(llm, "hi"), SamplingParams(structured_outputs=StructuredOutputsParams(choice=[])))
    # In the engine, a failed compile finishes only that request, with an error.
    engine = llm.engine
    bad = engine.add_request(chat_ids(llm, "hi")["prompt_token_ids"],
                             SamplingParams(max_tokens=4,
                                            structured_outputs=StructuredOutputsParams(json={"type": "frobnicate"})))
    good = engine.add_request(chat_ids(llm, "hello")["prompt_token_ids"], SamplingParams(max_tokens=4, temperature=0))
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    assert done[bad].error and "frobnicate" in done[bad].error and done[bad].outputs[0].finish_reason == "error"
    assert done[good].error is None and len(done[good].outputs[0].token_ids) == 4
    assert_no_leaks(llm)


@pytest.mark.parametrize("preemption_mode", ["recompute", "swap"])
def test_guided_survives_preemption(smollm2_dir, preemption_mode):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"], "additionalProperties": False}
    # 8 blocks of 16 tokens: two ~50-token prompts fill most of it, so growing sequences preempt.
    small = LLM(str(smollm2_dir), dtype="float32", kv_cache_memory=8 * 737280, block_size=16, max_model_len=128,
                preemption_mode=preemption_mode, swap_space=64 * 737280 / (1 << 30), schedule_conservativeness=0)
    prompts = [chat_ids(small, f"Describe person number {i} as JSON.") for i in range(6)]
    outs = small.generate(prompts, json_params(schema, 64))
    assert small.engine.scheduler.num_preemptions > 0
    assert (small.engine.scheduler.num_swap_outs > 0) == (preemption_mode == "swap")
    for out in outs:
        jsonschema.validate(json.loads(out.outputs[0].text), schema)
    assert_no_leaks(small)
    swap = small.engine.kv_cache.swap_space
    assert swap.num_free_blocks == swap.num_blocks and not small.engine.scheduler.swapped
    small.engine.close()


def test_disable_any_whitespace_leaves_none_between_json_tokens(llm):
    """vLLM's disable_any_whitespace, on a schema of the regex path and on a recursive one (the
    grammar path): no whitespace outside strings, and there are none here."""
    flat = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array",
            "items": {"type": "boolean"}, "minItems": 2}}, "required": ["a", "b"]}
    tree = {"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
        "required": ["v", "kids"]}}}
    prompt = chat_ids(llm, "Answer with pretty-printed JSON, indented.")
    params = [SamplingParams(max_tokens=96, temperature=1.0, seed=i, structured_outputs=StructuredOutputsParams(
        json=schema, disable_any_whitespace=True)) for i, schema in enumerate((flat, tree))]
    for schema, out in zip((flat, tree), llm.generate([prompt, prompt], params)):
        text = out.outputs[0].text
        assert out.outputs[0].finish_reason == "stop" and not re.search(r"\s", text), text
        jsonschema.Draft202012Validator(schema).validate(json.loads(text))


def test_guided_params_need_exactly_one_kind():
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams()
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(regex="a", json={})


def test_a_max_tokens_below_the_shortest_completion_is_refused_naming_the_minimum(llm):
    """Thirty digits take thirty of SmolLM2's tokens, and EOS one more: a max_tokens of 20 would cut
    the output, so the request is refused up front (given its grammar) or fails before its first
    token (compiled in the background), naming the minimum."""
    guided = StructuredOutputsParams(regex="[0-9]{30}")
    prompt = chat_ids(llm, "Thirty digits, please.")["prompt_token_ids"]
    grammar = llm.engine.guided.submit(guided).result()
    with pytest.raises(ValueError, match="max_tokens 20 .* at least 31"):
        llm.engine.add_request(prompt, SamplingParams(max_tokens=20, structured_outputs=guided), grammar=grammar)
    out = llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=20, structured_outputs=guided))[0]
    assert out.outputs[0].finish_reason == "error" and "at least 31" in out.error
    out = llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=31, structured_outputs=guided))[0]
    assert re.fullmatch("[0-9]{30}", out.outputs[0].text)
    assert_no_leaks(llm)


def test_a_slow_matcher_parks_its_sequence_not_the_batch(tiny_llama_dir):
    """A matcher whose first row takes 2 s of work beside unguided and guided requests: each step
    gives it at most the step's allowance (it waits, parked, the batch does not), the others run
    to their last token meanwhile, then it completes within its constraint."""
    llm = LLM(str(tiny_llama_dir), dtype="float32", kv_cache_memory=4_000_000, grammar_cache_dir=None,
              grammar_compile_workers=1)
    engine = llm.engine
    ready = engine.guided.submit(StructuredOutputsParams(regex=r"[0-9]{2,4}")).result()
    slow = SlowRowGrammar(engine.guided.submit(StructuredOutputsParams(regex=r"[a-z]{3,6}!")).result(), 400)
    greedy = lambda n, **kw: SamplingParams(max_tokens=n, temperature=0.0, **kw)  # noqa: E731
    slow_id = engine.add_request([5, 6, 7], greedy(12), grammar=slow)
    others = {engine.add_request([9, 10, 11 + i], greedy(16, ignore_eos=True)) for i in range(2)}
    others |= {engine.add_request([12, 13, 14 + i], greedy(8), grammar=ready) for i in range(2)}
    max_units_per_step = int(STEP_ALLOWANCE_S / UNIT_S) + 1  # a unit lasts UNIT_S at least
    finished = {}

    def step_until(request_ids: set[str]) -> None:
        while not request_ids <= finished.keys():
            before = slow.units_done
            finished.update((out.request_id, out) for out in engine.step() if out.finished)
            assert slow.units_done - before <= max_units_per_step

    step_until(others)
    assert slow.units_done < slow.units and slow_id not in finished
    step_until({slow_id})
    assert slow.units_done == slow.units and others <= finished.keys()
    for request_id in others:
        assert finished[request_id].outputs[0].finish_reason in ("stop", "length")
    assert re.fullmatch(r"[a-z]{3,6}!", finished[slow_id].outputs[0].text)
    assert_no_leaks(llm)
    engine.close()


def test_mask_workers_give_the_outputs_of_the_engine_thread(llm, smollm2_dir):
    """Matchers in worker processes (grammar_mask_workers, the GPU default) give every sequence
    the tokens it gets with its matcher on the engine's thread, sampled at random as well."""
    names = ["person", "invoice", "calendar_event", "nullable_fields"]
    schemas = [json.loads((SCHEMAS_DIR / f"{n}.json").read_text()) for n in names]
    prompts = [chat_ids(llm, schema_prompt(n, s)) for n, s in zip(names, schemas)] * 2
    params = [json_params(s, 96) for s in schemas]
    params += [SamplingParams(max_tokens=96, temperature=1.0, seed=i, structured_outputs=StructuredOutputsParams(json=s))
               for i, s in enumerate(schemas)]
    prompts += [chat_ids(llm, "A code:"), chat_ids(llm, "Yes or no?")]
    params += [SamplingParams(max_tokens=12, temperature=1.0, seed=7,
                              structured_outputs=StructuredOutputsParams(regex=r"[A-Z]{2}-\d{3,6}")),
               SamplingParams(max_tokens=4, temperature=1.0, seed=8,
                              structured_outputs=StructuredOutputsParams(choice=["yes", "no"]))]
    here = llm.generate(prompts, params)
    pooled_llm = LLM(str(smollm2_dir), dtype="float32", kv_cache_memory=512 << 20, grammar_mask_workers=2)
    try:
        pooled = pooled_llm.generate(prompts, params)
        gc.collect()  # finished sequences let go of their matchers in the workers
        assert [matchers for _, matchers in pooled_llm.engine.guided.pool.held()] == [0, 0]
    finally:
        pooled_llm.engine.close()
    for a, b in zip(here, pooled):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids and b.outputs[0].finish_reason == "stop"
