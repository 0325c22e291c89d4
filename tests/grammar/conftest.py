"""Tokenizers for the grammar tests: SmolLM2's byte-level BPE, a SentencePiece-style BPE with byte
fallback, and the tiny byte-level tokenizer of tests.helpers."""
import json

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from gdserve.models import load_tokenizer
from tests.helpers import save_byte_tokenizer

SP_CORPUS = ["hello world, the quick brown fox jumps over the lazy dog.",
             "Hello there! The weather is nice today; isn't it?",
             "café crème brûlée — naïve façade", "numbers 0123456789 and symbols {}[]()\"'"]


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir):
    return load_tokenizer(smollm2_dir)


@pytest.fixture(scope="session")
def byte_tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("byte-tokenizer")
    save_byte_tokenizer(path)
    return load_tokenizer(path)


@pytest.fixture(scope="session")
def sp_tokenizer():
    """Llama-2 style: "▁" metaspace, <unk> <s> </s> at 0..2, the <0x00>..<0xFF> byte-fallback
    tokens at 3..258, then a BPE vocabulary trained on a small corpus; decoder Replace +
    ByteFallback + Fuse + Strip, as Llama's."""
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trained.train_from_iterator(SP_CORPUS * 4, trainers.BpeTrainer(vocab_size=300, min_frequency=1))
    model = json.loads(trained.to_str())["model"]
    specials = ["<unk>", "<s>", "</s>"]
    vocab = {t: i for i, t in enumerate(specials + [f"<0x{b:02X}>" for b in range(256)])}
    for token in sorted(model["vocab"], key=model["vocab"].get):
        vocab.setdefault(token, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens(specials)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>")
