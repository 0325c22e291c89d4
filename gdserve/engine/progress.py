"""A progress bar of prompts done, with the input and output tokens/s so far (the offline API's,
the benches')."""
import sys
import time

from tqdm import tqdm


class GenerationProgress:
    """A tqdm bar over a batch's prompts, shown only where use_tqdm is set and stderr is a
    terminal (a log file or a pipe gets no carriage-return noise)."""

    def __init__(self, num_prompts: int, use_tqdm: bool = True, desc: str = "Processed prompts"):
        self.start = time.perf_counter()
        self.num_prompt_tokens = self.num_output_tokens = 0
        self.bar = None
        if use_tqdm and sys.stderr.isatty():
            self.bar = tqdm(total=num_prompts, desc=desc, file=sys.stderr, dynamic_ncols=True,
                            postfix=_speeds(0.0, 0.0))

    def update(self, num_prompt_tokens: int, num_output_tokens: int) -> None:
        """A prompt has finished, with these token counts."""
        if self.bar is None:
            return
        self.num_prompt_tokens += num_prompt_tokens
        self.num_output_tokens += num_output_tokens
        seconds = max(time.perf_counter() - self.start, 1e-9)
        self.bar.set_postfix_str(_speeds(self.num_prompt_tokens / seconds, self.num_output_tokens / seconds),
                                 refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _speeds(input_per_s: float, output_per_s: float) -> str:
    return f"est. speed input: {input_per_s:.2f} toks/s, output: {output_per_s:.2f} toks/s"
