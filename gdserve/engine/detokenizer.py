"""Incremental detokenization with exact stop-string handling.

Text is decoded over a sliding window of token ids (vLLM's prefix_offset / read_offset): the delta
of a step is decode(ids[prefix:]) minus decode(ids[prefix:read]). Trailing U+FFFD means a character
whose bytes have not all arrived yet, so it is held until they do. The window starts with a few
prompt tokens so that decoders which strip the first token's leading space (SentencePiece's "▁")
keep the space of the first generated token. So output_text == tokenizer.decode(output_ids) for
byte-level BPE; for SentencePiece it is what the output adds to the decoded prompt.

Stop strings: output_text is cut before the stop string that completes first (or after it with
include_stop_str_in_output), and text that could still begin a stop string is held back.

Deferred: where nobody reads the text before the sequence finishes (no stop strings, the final
output only), append only records the token and flush decodes the whole output once: one decode
per sequence instead of two per token, the largest share of the engine's host work per token.
The text is the incremental one's, but where a byte-fallback vocabulary's byte tokens do not form
valid UTF-8: the windows may group such bytes otherwise (U+FFFD either way).
"""
from transformers import PreTrainedTokenizerBase

# Prompt tokens kept as decoding context (at least).
_PROMPT_CONTEXT = 5
_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, prompt_token_ids: list[int],
                 skip_special_tokens: bool, stop: list[str], include_stop_str_in_output: bool,
                 deferred: bool = False):
        self.tokenizer = tokenizer
        # A fast tokenizer's own decoder: what tokenizer.decode calls (clean-up off), without
        # its per-call conversions, which cost more than the decode (two decodes per token).
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self.skip_special_tokens = skip_special_tokens
        self.stop = list(stop)
        self.include_stop_str_in_output = include_stop_str_in_output
        self.deferred = deferred and not self.stop
        self.token_ids = self._prompt_context(prompt_token_ids)  # then the generated tokens
        self.prefix_offset = 0                 # the window the current delta is measured against
        self.read_offset = len(self.token_ids)  # tokens before it are fully decoded
        self.num_window_chars = 0              # chars of the pending window delta in output_text
        self.output_text = ""
        self.num_emitted = 0                   # chars of output_text returned to the caller
        self.stop_reason: str | None = None

    def append(self, token_id: int) -> str:
        """Add a generated token; return the text that is now safe to emit (maybe "")."""
        if self.stop_reason is not None:
            raise RuntimeError("append() after a stop string was matched")
        self.token_ids.append(token_id)
        if self.deferred:
            return ""
        delta = self._window_delta()
        # Slide the window only past tokens that produced text: a window that starts with skipped
        # special tokens would let the decoder strip the next token's leading space.
        complete = delta != "" and not delta.endswith(_REPLACEMENT)
        self._extend(delta if complete else delta.rstrip(_REPLACEMENT), complete)
        return self._release(final=False)

    def flush(self) -> str:
        """At finish: release held-back text, including any incomplete character (as U+FFFD)."""
        if self.stop_reason is None:
            self._extend(self._window_delta(), complete=True)
        return self._release(final=True)

    def _prompt_context(self, prompt_token_ids: list[int]) -> list[int]:
        """The last few prompt tokens, widened until they decode without U+FFFD: a byte-fallback
        decoder turns a whole run of byte tokens into U+FFFDs if it starts inside a character."""
        for n in range(_PROMPT_CONTEXT, _PROMPT_CONTEXT + 4):
            context = list(prompt_token_ids[-n:])
            if _REPLACEMENT not in self._decode(context):
                return context
            if n >= len(prompt_token_ids):
                break
        return []  # no clean context (invalid bytes in the prompt): decode the output on its own

    def _decode(self, token_ids: list[int]) -> str:
        if self._backend is not None:
            return self._backend.decode(token_ids, skip_special_tokens=self.skip_special_tokens)
        return self.tokenizer.decode(token_ids, skip_special_tokens=self.skip_special_tokens,
                                     clean_up_tokenization_spaces=False)

    def _window_delta(self) -> str:
        prefix_text = self._decode(self.token_ids[self.prefix_offset:self.read_offset])
        return self._decode(self.token_ids[self.prefix_offset:])[len(prefix_text):]

    def _extend(self, window_delta: str, complete: bool) -> None:
        """Append the part of the window's delta not yet in output_text; look for stop strings.
        complete: the window decoded cleanly, so it slides forward."""
        new = window_delta[self.num_window_chars:]
        if complete:
            self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
            self.num_window_chars = 0
        else:
            self.num_window_chars = len(window_delta)
        old_len = len(self.output_text)
        self.output_text += new
        if new and self.stop:
            self._check_stop(old_len)

    def _check_stop(self, old_len: int) -> None:
        """Find the stop string that completes first; only matches ending in the new text count."""
        best = None  # (end, start, stop)
        for stop in self.stop:
            start = self.output_text.find(stop, max(0, old_len - len(stop) + 1))
            if start != -1 and (best is None or (start + len(stop), start) < best[:2]):
                best = (start + len(stop), start, stop)
        if best is not None:
            end, start, self.stop_reason = best
            self.output_text = self.output_text[:end if self.include_stop_str_in_output else start]

    def _release(self, final: bool) -> str:
        hold = 0 if final or self.stop_reason is not None else self._partial_stop_len()
        end = max(self.num_emitted, len(self.output_text) - hold)
        delta = self.output_text[self.num_emitted:end]
        self.num_emitted = end
        return delta

    def _partial_stop_len(self) -> int:
        """Length of the longest suffix of output_text that is a proper prefix of a stop string."""
        text = self.output_text
        return max((k for stop in self.stop for k in range(min(len(stop) - 1, len(text)), 0, -1)
                    if text.endswith(stop[:k])), default=0)
