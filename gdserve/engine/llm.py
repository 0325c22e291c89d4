"""The offline API: batch generation on the engine, in the caller's thread."""
import dataclasses
from collections.abc import Sequence as SequenceABC
from concurrent.futures import Future

from gdserve.config import EngineConfig
from gdserve.engine.llm_engine import LLMEngine
from gdserve.engine.progress import GenerationProgress
from gdserve.lora.request import LoRARequest
from gdserve.models.registry import DEFAULT_MODEL
from gdserve.outputs import RequestOutput
from gdserve.sampling_params import SamplingParams

Prompt = str | dict  # a string, or {"prompt_token_ids": [...]} (optionally with "prompt")


class LLM:
    """`LLM(model="smollm2-135m-instruct", **engine_args)`; engine_args are EngineConfig fields."""

    def __init__(self, model: str = DEFAULT_MODEL, **engine_args):
        self.engine = LLMEngine(EngineConfig(model=model, **engine_args))

    def close(self) -> None:
        """Stop the engine's worker processes (compile workers, tensor-parallel ranks); also done
        when the LLM is garbage-collected or the interpreter exits. Idempotent."""
        self.engine.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def get_tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: Prompt | list[Prompt],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 lora_request: LoRARequest | list[LoRARequest | None] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """lora_request: one adapter for every prompt, or a list with one (or None) per prompt.
        use_tqdm: a progress bar on stderr, where stderr is a terminal."""
        prompts = [prompts] if isinstance(prompts, (str, dict)) else list(prompts)
        tokenized = [self._tokenize(p) for p in prompts]
        return self._run(tokenized, self._params_per_prompt(sampling_params, len(prompts)),
                         self._loras_per_prompt(lora_request, len(prompts)), use_tqdm)

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | list[SamplingParams] | None = None,
             chat_template: str | None = None, add_generation_prompt: bool = True,
             chat_template_kwargs: dict | None = None,
             lora_request: LoRARequest | list[LoRARequest | None] | None = None,
             use_tqdm: bool = True) -> list[RequestOutput]:
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        tokenizer = self.engine.tokenizer
        tokenized = []
        for conversation in conversations:
            text = tokenizer.apply_chat_template(conversation, chat_template=chat_template, tokenize=False,
                                                 add_generation_prompt=add_generation_prompt,
                                                 **(chat_template_kwargs or {}))
            tokenized.append((text, tokenizer.encode(text, add_special_tokens=False)))
        return self._run(tokenized, self._params_per_prompt(sampling_params, len(conversations)),
                         self._loras_per_prompt(lora_request, len(conversations)), use_tqdm)

    def _tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, self.engine.tokenizer.encode(prompt)
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            return prompt.get("prompt"), list(prompt["prompt_token_ids"])
        raise ValueError(f"prompt must be a string or a dict with 'prompt_token_ids', got {type(prompt).__name__}")

    @staticmethod
    def _params_per_prompt(params, num_prompts: int) -> list[SamplingParams]:
        if params is None:
            return [SamplingParams()] * num_prompts
        if isinstance(params, SamplingParams):
            return [params] * num_prompts
        if not isinstance(params, SequenceABC) or len(params) != num_prompts:
            raise ValueError("sampling_params must be one SamplingParams or a list with one per prompt")
        return list(params)

    @staticmethod
    def _loras_per_prompt(lora_request, num_prompts: int) -> list[LoRARequest | None]:
        if lora_request is None or isinstance(lora_request, LoRARequest):
            return [lora_request] * num_prompts
        if (not isinstance(lora_request, SequenceABC) or len(lora_request) != num_prompts
                or not all(r is None or isinstance(r, LoRARequest) for r in lora_request)):
            raise ValueError("lora_request must be one LoRARequest or a list with one (or None) per prompt")
        return list(lora_request)

    def _run(self, prompts: list[tuple[str | None, list[int]]], params: list[SamplingParams],
             loras: list[LoRARequest | None], use_tqdm: bool) -> list[RequestOutput]:
        """Every request starts at once, guided ones while their constraints compile (in parallel,
        cached), so no request waits for another's compile; a constraint that fails to compile
        aborts the batch and raises its GrammarError as soon as it is known."""
        engine = self.engine
        compiles = [engine.guided.submit(p.structured_outputs) for p in params if p.structured_outputs is not None]
        ids = []
        progress = GenerationProgress(len(prompts), use_tqdm)
        try:
            for (text, token_ids), p, lora in zip(prompts, params, loras):
                p = dataclasses.replace(p, output_kind="final_only")  # nothing streams here
                ids.append(engine.add_request(token_ids, p, prompt=text, lora_request=lora))
            finished: dict[str, RequestOutput] = {}
            while len(finished) < len(ids):
                _raise_failed_compile(compiles)
                for out in engine.step():
                    if out.finished:
                        finished[out.request_id] = out
                        progress.update(out.num_prompt_tokens, out.num_generated_tokens)
            _raise_failed_compile(compiles)
        except BaseException:
            for request_id in ids:
                engine.abort_request(request_id)
            raise
        finally:
            progress.close()
        return [finished[i] for i in ids]


def _raise_failed_compile(compiles: list[Future]) -> None:
    for future in compiles:
        if future.done() and future.exception() is not None:
            raise future.exception()
