import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from gdserve.layers.quantization import QUANTIZATIONS
from gdserve.models.registry import DEFAULT_MODEL
from gdserve.utils import reject_unknown_fields


@reject_unknown_fields("engine argument")
@dataclass
class EngineConfig:
    model: str = DEFAULT_MODEL
    tokenizer: str | None = None          # defaults to the model's own
    dtype: str = "auto"                   # auto: bfloat16 on CUDA and on CPUs with native bf16, else float32
    device: str = "auto"                  # auto: cuda when available
    # auto: the model's dtype. fp8 (= fp8_e4m3) / fp8_e5m2 store K and V in 8 bits (scale 1.0,
    # saturating): twice the blocks, half the bytes each decode step reads
    kv_cache_dtype: str = "auto"
    # With an e4m3 cache: prefill attention's scores in fp8 (queries quantized per row), at twice
    # float16's tensor-core rate, as FA3 and TensorRT-LLM's fp8 context attention, with queries
    # and keys turned by a fixed rotation first (the cache holds the turned keys); P.V and decode
    # keep exact float16 dots over the cache (docs/quantization.md)
    fp8_attention: bool = False
    load_format: str = "auto"             # "dummy": random weights of the model's shapes
    # None: weights in `dtype`, unless config.json's quantization_config names awq or gptq. "fp8": the
    # linear layers (LM head apart) in fp8 e4m3 with a scale per output channel, activations quantized
    # per token on the fly (W8A8 dynamic; CUDA sm_89+ or CPU). "awq" / "gptq" / "gguf": the
    # checkpoint's 4-bit (or 8-bit) linear layers stay packed in memory (docs/quantization.md)
    quantization: str | None = None
    max_model_len: int | None = None      # defaults to the model's max_position_embeddings
    # Sequences in the running batch. None: sized from the KV cache once it is allocated
    # (default_max_num_seqs): 1,024 seats on an H200 serving an 8B model, where 256 left the GPU
    # partly idle on short requests; 256 for the CPU's default 1 GiB cache
    max_num_seqs: int | None = None
    # Tokens per step. None: 8192 on CUDA (prefill chunks big enough for the GEMMs to run near peak:
    # 1.6x faster prefill than 2048 on an H200), 2048 on CPU (shorter steps between decodes)
    max_num_batched_tokens: int | None = None
    block_size: int = 16
    kv_cache_memory: int = 1 << 30        # bytes for the KV cache on CPU
    gpu_memory_utilization: float = 0.9   # share of device memory for weights + activations + KV on CUDA
    num_gpu_blocks_override: int | None = None  # KV blocks, instead of what the memory settings give
    enable_prefix_caching: bool = True
    # Preemption (vLLM's names): "recompute" drops a preempted sequence's KV blocks and prefills
    # its tokens again when it is readmitted; "swap" copies them to swap_space GiB of CPU memory
    # (pinned on CUDA) and back, falling back to recompute when the swap space is full. None: recompute
    preemption_mode: str | None = None
    swap_space: float = 4
    # Admission keeps KV blocks free for the running sequences' expected growth (GrowthReserve):
    # the share of max_tokens recent requests generated, times this (SGLang's name). 0: admit
    # while the prompt fits, preempting when sequences outgrow the cache
    schedule_conservativeness: float = 1.0
    seed: int = 0
    grammar_compile_timeout_s: float = 10.0  # a guided request whose constraint takes longer fails
    # Processes compiling constraints off the engine loop, one constraint each at a time. None: one
    # per usable core (the process's CPU affinity) less one for the engine loop, at most 8: a burst
    # of new schemas then compiles in parallel, while the cap bounds memory (each worker holds the
    # vocabulary, its token trie and its own imports, ~250 MB resident). The engine starts them
    # with itself, in the background, so a first burst of guided requests waits only for compiles.
    grammar_compile_workers: int | None = None
    # Processes holding the guided sequences' matchers, so that a step's rows are computed on that
    # many cores at once (grammar/matcher_pool.py). None: on a GPU the usable cores less two (the
    # engine loop's, and one for the compile workers), at most 16: the forward leaves the host's
    # cores free; on the CPU 0, the engine's thread (the cores run the forward)
    grammar_mask_workers: int | None = None
    # Compiled grammars persist here across restarts ("auto": $GDSERVE_CACHE/grammars; None: off)
    grammar_cache_dir: str | None = "auto"
    # Guided sequences take the text their constraint forces (keys, punctuation, the rest of an
    # enum value) as tokens appended without a decode step each, prefilled by the next step as a
    # chunk; a request that asks for logprobs decodes every token. None: on the CPU, where it is
    # measured to cost nothing where little is forced; off on CUDA until measured there
    enable_forced_tokens: bool | None = None
    enforce_eager: bool = False              # CUDA: no CUDA graphs for decode steps
    # Read each step's sampled tokens back during the next step's forward (None: on CUDA only;
    # on CPU the forward runs on the calling thread, so there is nothing to overlap)
    async_scheduling: bool | None = None
    # LoRA adapters (vLLM's names): a batch mixes the base model and up to max_loras adapters, each
    # in a GPU slot of max_lora_rank; up to max_cpu_loras adapters (None: max_loras) stay read in
    # CPU memory, the least recently used leaving first
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    # Ranks the model is split across (tensor parallelism on one machine): one process each, on
    # cuda:0..N-1 on CUDA (NCCL), or on the CPU (gloo, the cores shared among them). The KV-cache
    # memory settings are per rank
    tensor_parallel_size: int = 1

    def __post_init__(self):
        _check(self.max_num_seqs is None or self.max_num_seqs >= 1, "max_num_seqs", "must be >= 1")
        if self.max_num_batched_tokens is None:
            self.max_num_batched_tokens = 8192 if self.torch_device().type == "cuda" else 2048
        _check(self.max_num_batched_tokens >= 1, "max_num_batched_tokens", "must be >= 1")
        _check(self.block_size >= 1, "block_size", "must be >= 1")
        _check(self.kv_cache_memory > 0, "kv_cache_memory", "must be > 0 bytes")
        _check(0 < self.gpu_memory_utilization <= 1, "gpu_memory_utilization", "must be in (0, 1]")
        _check(self.num_gpu_blocks_override is None or self.num_gpu_blocks_override >= 1,
               "num_gpu_blocks_override", "must be >= 1")
        _check(self.max_model_len is None or self.max_model_len >= 1, "max_model_len", "must be >= 1")
        _check(self.dtype in _DTYPES or self.dtype == "auto", "dtype",
               f"must be 'auto' or one of {sorted(_DTYPES)}")
        _check(self.kv_cache_dtype in KV_CACHE_DTYPES or self.kv_cache_dtype == "auto", "kv_cache_dtype",
               f"must be 'auto' or one of {sorted(KV_CACHE_DTYPES)}")
        _check(not self.fp8_attention or self.kv_cache_dtype in ("fp8", "fp8_e4m3"), "fp8_attention",
               f"needs kv_cache_dtype 'fp8' (e4m3), not {self.kv_cache_dtype!r}")
        _check(self.load_format in ("auto", "dummy"), "load_format", "must be 'auto' or 'dummy'")
        _check(self.quantization is None or self.quantization in QUANTIZATIONS, "quantization",
               f"must be None or one of {list(QUANTIZATIONS)}")
        _check(self.preemption_mode in PREEMPTION_MODES, "preemption_mode",
               f"must be one of {list(PREEMPTION_MODES)}")
        _check(self.swap_space >= 0, "swap_space", "must be >= 0 GiB")
        _check(self.schedule_conservativeness >= 0, "schedule_conservativeness", "must be >= 0")
        _check(self.preemption_mode != "swap" or self.swap_space > 0, "swap_space",
               "must be > 0 GiB with preemption_mode 'swap'")
        _check(self.grammar_compile_timeout_s > 0, "grammar_compile_timeout_s", "must be > 0")
        if self.grammar_compile_workers is None:
            self.grammar_compile_workers = default_compile_workers()
        _check(self.grammar_compile_workers >= 1, "grammar_compile_workers", "must be >= 1")
        if self.grammar_mask_workers is None:
            self.grammar_mask_workers = default_mask_workers(self.torch_device())
        _check(self.grammar_mask_workers >= 0, "grammar_mask_workers", "must be >= 0")
        if self.enable_forced_tokens is None:
            self.enable_forced_tokens = self.torch_device().type == "cpu"
        _check(self.max_loras >= 1, "max_loras", "must be >= 1")
        _check(self.max_lora_rank >= 1, "max_lora_rank", "must be >= 1")
        if self.max_cpu_loras is None:
            self.max_cpu_loras = self.max_loras
        _check(self.max_cpu_loras >= self.max_loras, "max_cpu_loras",
               f"must be >= max_loras ({self.max_loras})")
        self._check_tensor_parallel()

    def _check_tensor_parallel(self) -> None:
        size = self.tensor_parallel_size
        _check(isinstance(size, int) and size >= 1, "tensor_parallel_size", "must be an integer >= 1")
        if size == 1:
            return
        _check(not self.enable_lora, "tensor_parallel_size",
               f"{size} with enable_lora is not supported yet (LoRA serves on one device)")
        _check(self.quantization in (None, "fp8"), "tensor_parallel_size",
               f"{size} with quantization {self.quantization!r} is not supported yet (packed 4-bit weights "
               "serve on one device)")
        device = self.torch_device()
        _check(device.index is None, "tensor_parallel_size",
               f"{size} places rank r on cuda:r; device must be 'auto' or 'cuda', not {self.device!r}")

    def grammar_cache_path(self) -> Path | None:
        if self.grammar_cache_dir == "auto":
            from gdserve.models.loader import cache_root
            return cache_root() / "grammars"
        return None if self.grammar_cache_dir is None else Path(self.grammar_cache_dir)

    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        try:
            return torch.device(self.device)
        except RuntimeError:
            raise ValueError(f"device {self.device!r} is not a torch device (e.g. 'cpu', 'cuda', 'cuda:1')") from None

    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            native_bf16 = self.torch_device().type == "cuda" or cpu_has_native_bf16()
            return torch.bfloat16 if native_bf16 else torch.float32
        return _DTYPES[self.dtype]

    def torch_kv_cache_dtype(self) -> torch.dtype:
        return self.torch_dtype() if self.kv_cache_dtype == "auto" else KV_CACHE_DTYPES[self.kv_cache_dtype]


PREEMPTION_MODES = (None, "recompute", "swap")
# max_num_seqs when unset: a seat per TOKENS_PER_SEAT tokens the KV cache holds, within
# these bounds (vLLM's defaults by GPU class: 256 below 70 GiB of memory, 1,024 above)
MIN_DEFAULT_SEQS, MAX_DEFAULT_SEQS, TOKENS_PER_SEAT = 256, 1024, 1024


def default_max_num_seqs(num_kv_tokens: int, max_num_batched_tokens: int) -> int:
    """Seats for a KV cache of num_kv_tokens: as many as hold TOKENS_PER_SEAT tokens each, within
    [MIN_DEFAULT_SEQS, MAX_DEFAULT_SEQS], and no more than a step's tokens (a decode is one each)."""
    seats = max(MIN_DEFAULT_SEQS, min(MAX_DEFAULT_SEQS, num_kv_tokens // TOKENS_PER_SEAT))
    return max(1, min(seats, max_num_batched_tokens))
MAX_DEFAULT_COMPILE_WORKERS = 8
MAX_DEFAULT_MASK_WORKERS = 16


def default_compile_workers() -> int:
    """grammar_compile_workers when unset: the usable cores less one, within [1, 8]."""
    return max(1, min(_usable_cores() - 1, MAX_DEFAULT_COMPILE_WORKERS))


def _usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_mask_workers(device: torch.device) -> int:
    """grammar_mask_workers when unset: on a GPU the usable cores less two, within [1, 16]; on
    the CPU none."""
    if device.type == "cpu":
        return 0
    return max(1, min(_usable_cores() - 2, MAX_DEFAULT_MASK_WORKERS))


@cache
def cpu_has_native_bf16() -> bool:
    """bf16 matmuls run at 3-4x the float32 rate on CPUs with AVX512-BF16 or AMX (measured on
    this project's CI CPU); elsewhere bf16 is emulated and slower than float32."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

KV_CACHE_DTYPES = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def _check(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{name} {message}")
