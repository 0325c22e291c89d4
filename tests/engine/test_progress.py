"""The progress bar: shown on a terminal's stderr when use_tqdm is set, never elsewhere."""
import io
import sys

import pytest

from gdserve import LLM, SamplingParams
from gdserve.engine.progress import GenerationProgress

PROMPTS = [{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [8, 9]}]


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def fake_terminal(monkeypatch) -> FakeTerminal:
    """stderr as a terminal, for the rest of the test (set in the test body: pytest's output capture
    puts its own stderr back between a fixture's setup and the test)."""
    stderr = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", stderr)
    return stderr


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    return LLM(str(tiny_llama_dir), dtype="float32", kv_cache_memory=1 << 22, block_size=4)


def test_bar_counts_prompts_and_token_speeds(monkeypatch):
    terminal = fake_terminal(monkeypatch)
    progress = GenerationProgress(2)
    progress.update(3, 4)
    progress.update(2, 4)
    progress.close()
    text = terminal.getvalue()
    assert "Processed prompts" in text and "2/2" in text
    assert "est. speed input:" in text and "toks/s, output:" in text


def test_no_bar_when_stderr_is_not_a_terminal(capsys):
    progress = GenerationProgress(1)
    progress.update(3, 4)
    progress.close()
    assert progress.bar is None and capsys.readouterr().err == ""


def test_generate_shows_the_bar_on_a_terminal(llm, monkeypatch):
    terminal = fake_terminal(monkeypatch)
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=3, ignore_eos=True))
    assert len(outs) == 2
    assert "Processed prompts" in terminal.getvalue() and "2/2" in terminal.getvalue()


def test_use_tqdm_false_shows_no_bar(llm, monkeypatch):
    terminal = fake_terminal(monkeypatch)
    llm.generate(PROMPTS, SamplingParams(max_tokens=3), use_tqdm=False)
    assert terminal.getvalue() == ""


def test_generate_without_a_terminal_shows_no_bar(llm, capsys):
    llm.generate(PROMPTS, SamplingParams(max_tokens=3))
    assert "Processed prompts" not in capsys.readouterr().err
