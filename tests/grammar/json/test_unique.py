"""uniqueItems over scalar items, kept by the matcher (grammar/json/unique.py): the token that would
complete a duplicate is refused by the mask and by accept_token alike, a token that continues a
longer item is not, rollback restores the items read, and an array that can take no other
distinct item can still close."""
import itertools
import json
import pickle

import pytest

from gdserve.grammar import GrammarError, compile_grammar
from tests.grammar.json.test_pydantic_schemas import allowed_ids

SET_STR = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
SET_INT = {"type": "object", "properties": {"ids": {"type": "array", "items": {"type": "integer"},
                                                    "uniqueItems": True}}, "required": ["ids"]}


def token_id(tokenizer, text: str) -> int:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == 1, f"{text!r} is {len(ids)} tokens"
    return ids[0]


def fed(grammar, tokenizer, text: str):
    """A matcher after `text`, fed one byte-level token per character (each must be accepted)."""
    matcher = grammar.matcher()
    for ch in text:
        assert matcher.accept_token(token_id(tokenizer, ch)), f"{ch!r} refused after {text!r}"
    return matcher


def agrees(matcher, token: int) -> bool:
    """Whether the token is allowed, asserting the mask and accept_token say the same (the
    matcher is left as it was)."""
    in_mask = token in set(allowed_ids(matcher).tolist())
    accepted = matcher.accept_token(token)
    if accepted:
        matcher.rollback(1)
    assert in_mask == accepted
    return accepted


def test_duplicate_string_refused_at_its_closing_quote(smollm2_tokenizer):
    tok = smollm2_tokenizer
    grammar = compile_grammar("json", SET_STR, tok)
    matcher = fed(grammar, tok, '["ab","ab')
    assert not agrees(matcher, token_id(tok, '"'))
    assert agrees(matcher, token_id(tok, "c"))        # "abc" is a new item
    assert not agrees(matcher, token_id(tok, '",'))  # a token that closes the duplicate and goes on


def test_json_equality_of_items(smollm2_tokenizer):
    tok = smollm2_tokenizer
    grammar = compile_grammar("json", SET_STR, tok)
    matcher = fed(grammar, tok, '["a","\\u0061')   # the escape spells "a" again
    assert not agrees(matcher, token_id(tok, '"'))
    numbers = compile_grammar("json", {"type": "array", "items": {"type": "number"}, "uniqueItems": True}, tok)
    matcher = fed(numbers, tok, "[1,1.0")              # 1.0 == 1
    assert not agrees(matcher, token_id(tok, "]"))
    assert agrees(matcher, token_id(tok, "5"))
    mixed = compile_grammar("json", {"type": "array", "items": {"type": ["boolean", "integer"]},
                                     "uniqueItems": True}, tok)
    matcher = fed(mixed, tok, "[true,1")               # true is not 1
    assert agrees(matcher, token_id(tok, "]"))


def test_duplicate_number_refused_where_it_ends(smollm2_tokenizer):
    tok = smollm2_tokenizer
    grammar = compile_grammar("json", SET_INT, tok)
    matcher = fed(grammar, tok, '{"ids":[1,2,1')
    for end in ("]", ",", " "):
        assert not agrees(matcher, token_id(tok, end))
    assert agrees(matcher, token_id(tok, "0"))         # 10 is new


def test_rollback_restores_the_items_read(smollm2_tokenizer):
    tok = smollm2_tokenizer
    grammar = compile_grammar("json", SET_STR, tok)
    matcher = fed(grammar, tok, '["x","y')
    quote = token_id(tok, '"')
    assert matcher.accept_token(quote)               # "y" is new
    matcher.rollback(3)                              # back to ["x",
    for ch in '"x':
        assert matcher.accept_token(token_id(tok, ch))
    assert not agrees(matcher, quote)                 # "x" again
    matcher.rollback(6)                              # back to [
    for ch in '"x':
        assert matcher.accept_token(token_id(tok, ch))
    assert agrees(matcher, quote)                     # the first "x" is forgotten


def test_exhausted_array_still_closes(smollm2_tokenizer):
    tok = smollm2_tokenizer
    schema = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 2}, "uniqueItems": True}
    grammar = compile_grammar("json", schema, tok)
    matcher = fed(grammar, tok, "[0,1,2")
    assert not agrees(matcher, token_id(tok, ","))    # no fourth distinct item exists
    assert agrees(matcher, token_id(tok, "]"))
    matcher = fed(grammar, tok, "[0,1,")
    assert not agrees(matcher, token_id(tok, "1"))    # only 2 can complete here
    assert agrees(matcher, token_id(tok, "2"))


def test_budget_closes_before_an_item_that_cannot_finish(smollm2_tokenizer):
    tok = smollm2_tokenizer
    schema = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "uniqueItems": True}
    grammar = compile_grammar("json", schema, tok)
    matcher = fed(grammar, tok, "[1,")
    one, two = token_id(tok, "1"), token_id(tok, "2")
    assert one in set(allowed_ids(matcher, budget=5).tolist())
    tight = set(allowed_ids(matcher, budget=1).tolist())  # room for one more byte: "]"
    assert two in tight and one not in tight               # "1" would have to grow to 1x


def test_budget_answers_do_not_depend_on_the_order_asked(smollm2_tokenizer):
    tok = smollm2_tokenizer
    schema = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "uniqueItems": True}
    grammar = compile_grammar("json", schema, tok)
    one = token_id(tok, "1")
    for budgets in ((1, 5, None, 1), (None, 1, 5), (5, 1, 2)):
        matcher = fed(grammar, tok, "[1,")
        for budget in budgets:
            assert (one in set(allowed_ids(matcher, budget=budget).tolist())) == (budget is None or budget >= 2)


def test_pickled_grammar_keeps_uniqueness(smollm2_tokenizer):
    tok = smollm2_tokenizer
    grammar = pickle.loads(pickle.dumps(compile_grammar("json", SET_STR, tok)))
    matcher = fed(grammar, tok, '["a","a')
    assert not agrees(matcher, token_id(tok, '"'))


def test_unique_items_in_recursive_schema(smollm2_tokenizer):
    schema = {"$defs": {"node": {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}, "$ref": "#/$defs/node"}
    with pytest.raises(GrammarError, match="uniqueItems inside the recursive schema"):
        compile_grammar("json", schema, smollm2_tokenizer)


def test_unique_items_over_objects_refused_or_relaxed(smollm2_tokenizer):
    schema = {"type": "array", "items": {"type": "object"}, "uniqueItems": True}
    with pytest.raises(GrammarError, match="uniqueItems at /.*only scalar items"):
        compile_grammar("json", schema, smollm2_tokenizer)
    grammar = compile_grammar("json", schema, smollm2_tokenizer, lenient=True)
    assert any(r.startswith("uniqueItems at /") for r in grammar.relaxed)


@pytest.mark.parametrize("enum", [
    ["credential_request", "payment_request", "unexpected_attachment", "mismatched_link_text",
     "generic_greeting", "reply_to_mismatch", "url_shortener"],
    ["credential_request_for_the_admin_console_v1", "credential_request_for_the_admin_console_v2", "other"],
], ids=["distinct-starts", "long-shared-prefix"])
def test_every_pair_of_enum_values_is_accepted_in_either_order(smollm2_tokenizer, enum):
    """A search for a new item after `,` tries first the bytes that leave the earlier items: an
    earlier value's own spelling, however long, is not explored before the others."""
    grammar = compile_grammar("json", {"type": "array", "uniqueItems": True, "items": {"enum": enum}},
                              smollm2_tokenizer)
    for pair in itertools.permutations(enum, 2):
        for text in (json.dumps(list(pair)), json.dumps(list(pair), separators=(",", ":"))):
            matcher = grammar.matcher()
            ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
            assert all(matcher.accept_token(t) for t in ids), text
            assert matcher.accept_token(smollm2_tokenizer.eos_token_id), text
        duplicate = json.dumps([pair[0], pair[0]])
        matcher = grammar.matcher()
        assert not all(matcher.accept_token(t) for t in smollm2_tokenizer.encode(duplicate, add_special_tokens=False))
