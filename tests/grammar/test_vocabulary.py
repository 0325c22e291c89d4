import random

import pytest
from transformers import PreTrainedTokenizerFast

from gdserve.grammar import GrammarError
from gdserve.models import load_tokenizer
from gdserve.grammar.vocabulary import (TokenSpelling, UNICODE_TO_BYTE, detect_spelling,
                                        eos_token_ids_of, token_vocabulary)

TEXTS = ["Hello, world!", "  two  spaces\tand a tab\n", "café crème 日本語 🙂 ∑x²",
         "{\"a\": [1, 2.5e-3]}",
         "line1\r\nline2", "über naïve façade — “quotes”", "\x00\x07 control"]


def joined(vocab, ids) -> bytes:
    return b"".join(vocab.token_bytes[i] for i in ids)


def test_gpt2_byte_table_is_a_bijection():
    assert sorted(UNICODE_TO_BYTE.values()) == list(range(256))
    assert UNICODE_TO_BYTE["Ġ"] == ord(" ") and UNICODE_TO_BYTE["Ċ"] == ord("\n")
    assert UNICODE_TO_BYTE["ĉ"] == ord("\t") and UNICODE_TO_BYTE["A"] == ord("A")


def test_smollm2_spelling_specials_and_eos(smollm2_tokenizer):
    vocab = token_vocabulary(smollm2_tokenizer)
    assert detect_spelling(smollm2_tokenizer) == TokenSpelling(byte_level=True, space_marker=None,
                                                               byte_fallback=False)
    assert vocab.size == 49152
    assert vocab.eos_token_ids == {2}
    assert vocab.special_token_ids == set(range(17))
    assert all(vocab.token_bytes[i] is None for i in range(17))
    ids = smollm2_tokenizer.encode(" the\n", add_special_tokens=False)
    assert [vocab.token_bytes[i] for i in ids] == [b" the", b"\n"]


def test_smollm2_bytes_match_decode_of_encoded_texts(smollm2_tokenizer):
    vocab = token_vocabulary(smollm2_tokenizer)
    for text in TEXTS:
        ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
        assert joined(vocab, ids).decode() == text == smollm2_tokenizer.decode(ids)


def test_smollm2_bytes_match_decode_of_random_sequences(smollm2_tokenizer):
    vocab = token_vocabulary(smollm2_tokenizer)
    rng = random.Random(0)
    for _ in range(300):
        ids = [rng.randrange(17, vocab.size) for _ in range(rng.randrange(1, 12))]
        assert joined(vocab, ids).decode("utf-8", errors="replace") == smollm2_tokenizer.decode(ids)


def test_sentencepiece_byte_fallback_spelling(sp_tokenizer):
    vocab = token_vocabulary(sp_tokenizer)
    assert detect_spelling(sp_tokenizer) == TokenSpelling(byte_level=False, space_marker="▁",
                                                          byte_fallback=True)
    assert vocab.special_token_ids == {0, 1, 2} and vocab.eos_token_ids == {2}
    assert [vocab.token_bytes[3 + b] for b in (0x00, 0x41, 0xE6, 0xFF)] == [b"\x00", b"A", b"\xe6",
                                                                           b"\xff"]
    assert vocab.token_bytes[sp_tokenizer.convert_tokens_to_ids("▁hello")] == b" hello"


def test_sentencepiece_bytes_match_decode(sp_tokenizer):
    """The decoder strips one leading space (Llama's Strip step); mid-text bytes match exactly."""
    vocab = token_vocabulary(sp_tokenizer)
    for text in TEXTS[:3] + TEXTS[5:6]:
        ids = sp_tokenizer.encode(text, add_special_tokens=False)
        assert any(3 <= i < 259 for i in ids) or "日" not in text  # byte fallback exercised
        assert joined(vocab, ids).decode().removeprefix(" ") == sp_tokenizer.decode(ids)
    rng = random.Random(0)
    regular = range(259, vocab.size)
    for _ in range(300):
        ids = [rng.choice(regular) for _ in range(rng.randrange(1, 12))]
        assert joined(vocab, ids).decode().removeprefix(" ") == sp_tokenizer.decode(ids)


def test_byte_tokenizer_has_every_byte(byte_tokenizer):
    vocab = token_vocabulary(byte_tokenizer)
    assert sorted(b[0] for b in vocab.token_bytes if b is not None) == list(range(256))


def test_fingerprint_is_stable_and_distinguishes(smollm2_tokenizer, sp_tokenizer):
    a = token_vocabulary(smollm2_tokenizer)
    assert token_vocabulary(smollm2_tokenizer) is a  # cached per tokenizer
    b = token_vocabulary(smollm2_tokenizer, eos_token_ids={0})
    assert b.eos_token_ids == {0, 2} and b.fingerprint != a.fingerprint
    assert token_vocabulary(sp_tokenizer).fingerprint != a.fingerprint
    assert len(a.fingerprint) == 32


def test_outlines_vocabulary_cached_by_fingerprint(smollm2_tokenizer):
    vocab = token_vocabulary(smollm2_tokenizer)
    outlines_vocab = vocab.outlines_vocabulary()
    assert outlines_vocab is vocab.outlines_vocabulary()
    assert outlines_vocab.get_eos_token_id() == 2
    distinct = len({b for b in vocab.token_bytes if b is not None})
    assert len(outlines_vocab) == distinct + 2  # + EOS, + the start token


def test_eos_from_generation_config(smollm2_tokenizer, tmp_path):
    smollm2_tokenizer.save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": [2, 0]}')
    assert eos_token_ids_of(load_tokenizer(tmp_path), None) == {0, 2}
    assert eos_token_ids_of(smollm2_tokenizer, {7}) == {2, 7}


def test_no_eos_is_an_error(byte_tokenizer):
    no_eos = PreTrainedTokenizerFast(tokenizer_object=byte_tokenizer.backend_tokenizer)
    with pytest.raises(GrammarError, match="no EOS"):
        eos_token_ids_of(no_eos, None)
    assert eos_token_ids_of(no_eos, {2}) == {2}
