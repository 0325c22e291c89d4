"""schemas/agents/: what agents' tools and hand-offs ask for, the agents bench's default corpus
with schemas/. Each file is a valid 2020-12 schema with a title and a description (its prompt)
and examples that jsonschema accepts; each compiles, and its compiled grammar accepts every
example, compact and indented, token by token, then EOS."""
import json
from pathlib import Path

import jsonschema
import pytest

from gdserve.grammar import compile_grammar

AGENTS = Path(__file__).resolve().parents[3] / "schemas" / "agents"
FILES = sorted(AGENTS.glob("*.json"))


def test_the_corpus_is_large_and_distinct():
    every = sorted(AGENTS.parent.rglob("*.json"))
    assert len(FILES) >= 200
    assert len({json.dumps(json.loads(f.read_text()), sort_keys=True) for f in every}) == len(every)
    assert len(every) >= 256  # the agents bench's H200 default draws 256 distinct schemas


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_schema_is_valid_and_its_examples_pass(path):
    schema = json.loads(path.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema.get("title") and schema.get("description")
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    assert schema.get("examples"), "at least one example"
    for example in schema["examples"]:
        validator.validate(example)


def test_every_example_is_accepted_by_its_compiled_grammar(smollm2_tokenizer):
    rejected = []
    for path in FILES:
        schema = json.loads(path.read_text())
        grammar = compile_grammar("json", schema, smollm2_tokenizer)
        for example in schema["examples"]:
            for text in (json.dumps(example), json.dumps(example, indent=2)):
                matcher = grammar.matcher()
                ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
                if not (all(matcher.accept_token(t) for t in ids) and matcher.accept_token(min(grammar.eos_token_ids))):
                    rejected.append(f"{path.name}: {text[:60]}")
    assert rejected == []
