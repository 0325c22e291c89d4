"""Kind "grammar" through the engine with the default model (LLM offline API, greedy): every
built-in grammar's generations are in its language (lark parses the ones that end with EOS; the
ones cut by max_tokens are viable prefixes by the slow oracle)."""
import lark
import pytest

from gdserve import LLM, SamplingParams
from gdserve.grammar.cfg.oracle import LarkOracle
from gdserve.grammar.cfg.lark_spec import load_grammar_text
from gdserve.sampling_params import StructuredOutputsParams
from tests.helpers import chat_ids

PROMPTS = {
    "json": ["Describe a cat as a JSON object.", "List three colors as a JSON array."],
    "sql_select": ["Write a SQL query for the names of users older than 30.",
                   "SQL: count the orders per customer."],
    "arithmetic": ["Write an arithmetic expression that equals 10.", "Compute 3 times 4 plus 2."],
    "function_call": ["Call a function to get the weather in Paris.",
                      "Call send_email with a recipient and a subject."],
}


@pytest.fixture(scope="module")
def llm(smollm2_dir):
    llm = LLM(str(smollm2_dir), dtype="float32", kv_cache_memory=256 << 20)
    yield llm
    llm.engine.close()


def test_builtin_grammar_generations_parse(llm):
    cases = [(name, prompt) for name, prompts in PROMPTS.items() for prompt in prompts]
    params = [SamplingParams(max_tokens=40, temperature=0.0,
                             structured_outputs=StructuredOutputsParams(grammar=f"builtin:{name}"))
              for name, _ in cases]
    outs = llm.generate([chat_ids(llm, p) for _, p in cases], params)
    finished = 0
    for (name, prompt), out in zip(cases, outs):
        text, reason = out.outputs[0].text, out.outputs[0].finish_reason
        grammar = load_grammar_text(f"builtin:{name}")
        if reason == "stop":
            lark.Lark(grammar, parser="lalr").parse(text)
            finished += 1
        else:
            oracle = LarkOracle(grammar)
            assert oracle.viable(oracle.initial(), text.encode()) is not False, (name, text)
    assert finished >= len(cases) // 2, [o.outputs[0].text for o in outs]


def test_inline_lark_grammar(llm):
    grammar = 'start: NUMBER ("+" NUMBER)*\nNUMBER: /[0-9]+/'
    out = llm.generate(chat_ids(llm, "Write a sum of three numbers."),
                       SamplingParams(max_tokens=16, temperature=0.0,
                                      structured_outputs=StructuredOutputsParams(grammar=grammar)))[0]
    text = out.outputs[0].text
    assert text and all(part.isdigit() for part in text.split("+")), text
