"""Pydantic v2 models' own schemas (tests/grammar/json/pydantic_models.py): each compiles, and random
outputs (uniform among the allowed tokens, a closing budget) complete and pass
`Model.model_validate_json`. Where pydantic's schema is looser than its validator (GAPS, see
docs/guided-decoding.md) the outputs are checked against the schema, which is what is enforced."""
import json
import random

import jsonschema
import numpy as np
import pytest

from gdserve.grammar import allocate_token_bitmask, compile_grammar
from tests.grammar.json.pydantic_models import MODELS

SAMPLES = 3
MAX_TOKENS = 150
# model -> the field whose validator is stricter than its schema
GAPS = {
    "Price": "Decimal: the schema's string branch is any string",
    "Money": "Decimal: max_digits / decimal_places are not in the schema",
    "Span": "timedelta: pydantic caps each number of an ISO 8601 duration",
    "Site": "HttpUrl: format uri admits any scheme",
    "Contact": "EmailStr: email-validator asks more than format email (a dot in the domain, ...)",
}


def allowed_ids(matcher, budget: int | None = None) -> np.ndarray:
    bitmask = allocate_token_bitmask(1, matcher.grammar.vocab_size)
    matcher.fill_next_token_bitmask(bitmask, 0, budget=budget)
    return np.flatnonzero(np.unpackbits(bitmask[0].numpy().view(np.uint8), bitorder="little"))


def sample(grammar, rng: random.Random, max_tokens: int) -> list[int] | None:
    """Token ids drawn uniformly from each filled row, the budget passed as the engine does
    (max_tokens less the tokens so far, this one and EOS), until EOS or max_tokens; None if a
    row allows nothing or the text is not complete then."""
    matcher, out = grammar.matcher(), []
    while len(out) < max_tokens:
        ids = allowed_ids(matcher, max_tokens - len(out) - 2)
        if not len(ids):
            return None
        token = int(rng.choice(ids))
        assert matcher.accept_token(token)
        if token in grammar.eos_token_ids:
            return out
        out.append(token)
    return out if matcher.accept_token(min(grammar.eos_token_ids)) else None


@pytest.mark.parametrize("model", MODELS, ids=[m.__name__ for m in MODELS])
def test_pydantic_model_outputs_validate(model, smollm2_tokenizer):
    schema = model.model_json_schema()
    grammar = compile_grammar("json", schema, smollm2_tokenizer)
    rng = random.Random(f"pydantic-{model.__name__}")
    for _ in range(SAMPLES):
        ids = sample(grammar, rng, MAX_TOKENS)
        assert ids is not None, f"{model.__name__}: output not complete within {MAX_TOKENS} tokens"
        text = smollm2_tokenizer.decode(ids)
        if model.__name__ in GAPS:
            jsonschema.validate(json.loads(text), schema)
        else:
            model.model_validate_json(text)


def test_corpus_covers_thirty_models():
    assert len(MODELS) >= 30
    assert set(GAPS) <= {m.__name__ for m in MODELS}
