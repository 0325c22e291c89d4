"""The size of a constraint's shortest complete output, in tokens of SmolLM2's vocabulary."""
from gdserve.grammar import compile_grammar
from gdserve.grammar.completion_size import min_completion_tokens, shortest_text


def test_the_shortest_text_cut_into_the_longest_tokens(smollm2_tokenizer):
    text = "The capital of France is Paris"
    g = compile_grammar("choice", [text, text + " and Lyon"], smollm2_tokenizer)
    assert shortest_text(g) == text.encode()
    assert min_completion_tokens(g) == len(smollm2_tokenizer.encode(text, add_special_tokens=False))
    digits = compile_grammar("regex", "[0-9]{30}", smollm2_tokenizer)  # SmolLM2 splits digits
    assert min_completion_tokens(digits) == 30


def test_the_grammar_path_counts_its_completion(smollm2_tokenizer):
    g = compile_grammar("grammar", 'start: a a a a\na: b b b b\nb: "x" | "y" | "zz"\n', smollm2_tokenizer)
    needed = min_completion_tokens(g)
    assert needed == g.trie.greedy_count(g.completion(g.initial), g.vocab_size)
    assert 16 // g.trie.max_depth <= needed <= 16

