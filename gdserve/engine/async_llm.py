"""AsyncLLM: one LLMEngine stepped by a background thread, driven from asyncio.

The engine is owned by its loop thread, which also builds it: every call into it (add, abort, embed)
goes through a thread-safe inbox of closures that the thread drains between steps. Only this thread
runs torch ops: libgomp gives each thread that does its own OpenMP team, and once the teams hold more
threads than there are cores, their workers stop spinning between ops (measured: a step 1.2-1.4x slower
when the model was loaded on another thread than the one that steps it). Outputs travel back to each
request's asyncio.Queue through `loop.call_soon_threadsafe`. torch releases the GIL inside its
ops, so the event loop keeps serving HTTP while a step runs.

Failures: the engine contains a failed request or step itself (llm_engine.py); its callers see
RequestFailed. Should a step still raise (a bug in the engine's own bookkeeping), every request
in flight fails with RequestFailed, the engine is emptied, and it serves new requests. Once shut
down (or if its thread dies), the engine fails what is in flight and what comes after with
EngineDeadError: nothing waits on it forever.
"""
import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from concurrent.futures import Future

from gdserve.config import EngineConfig
from gdserve.engine.errors import EngineDeadError
from gdserve.engine.llm_engine import EngineStats, LLMEngine
from gdserve.grammar import Grammar
from gdserve.lora.request import LoRARequest
from gdserve.outputs import RequestOutput
from gdserve.sampling_params import StructuredOutputsParams, SamplingParams

logger = logging.getLogger(__name__)


class RequestFailed(RuntimeError):
    """The engine finished the request with an error (e.g. a failed step)."""


class AsyncLLM:
    def __init__(self, config: EngineConfig):
        """Load the engine on its own thread and start stepping it; a load error is raised here."""
        self._inbox: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._compile_lock = threading.Lock()
        # Nothing enters the inbox once _stopped is set. Reentrant: a RequestStream that the garbage
        # collector finalizes while this thread holds it submits its abort.
        self._inbox_lock = threading.RLock()
        self._shutdown_lock = threading.Lock()
        self._stopped = False
        self._num_active = 0  # generate() calls in flight, counted on the asyncio side
        loaded: Future = Future()
        self._thread = threading.Thread(target=self._run, args=(config, loaded), name="gdserve-engine", daemon=True)
        self._thread.start()
        self.engine: LLMEngine = loaded.result()
        self.tokenizer = self.engine.tokenizer
        self.stats: EngineStats = self.engine.stats()

    @property
    def alive(self) -> bool:
        """Whether the engine takes requests: not shut down, its thread running."""
        return not self._stopped and self._thread.is_alive()

    @property
    def num_active_requests(self) -> int:
        return self._num_active

    # ---- the asyncio side ------------------------------------------------------------------
    async def compile(self, guided: StructuredOutputsParams) -> tuple[Grammar, bool]:
        """Compile off the event loop (cached in the engine's compile service); raises
        GrammarError. Returns (grammar, whether it was a cache hit)."""
        future = await asyncio.to_thread(self._submit_compile, guided)
        hit = future.done()
        return await asyncio.wrap_future(future), hit

    def _submit_compile(self, guided: StructuredOutputsParams) -> Future:
        with self._compile_lock:  # the engine starts its compile service lazily, shutdown closes it
            if self._stopped:
                raise EngineDeadError("the engine has shut down")
            return self.engine.guided.submit(guided)

    async def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                          prompt: str | None = None, grammar: Grammar | None = None,
                          on_output: Callable[[RequestOutput], None] | None = None,
                          lora_request: LoRARequest | None = None) -> "RequestStream":
        """Queue a request; a bad one raises ValueError. Iterate the returned stream for its
        outputs; closing it (or dropping it) before the end aborts the request."""
        outputs: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def add() -> None:
            self.engine.add_request(prompt_token_ids, params, request_id, prompt, grammar, lora_request)
            self._streams[request_id] = (loop, outputs)

        self._num_active += 1
        stream = RequestStream(self, request_id, outputs, on_output)
        try:
            await self._call(add)
        except BaseException:
            stream.close()  # a cancelled add may have run already: abort it too
            raise
        return stream

    async def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                       prompt: str | None = None,
                       grammar: Grammar | None = None,
                       lora_request: LoRARequest | None = None) -> AsyncIterator[RequestOutput]:
        """add_request, then its outputs; leaving the loop early aborts the request."""
        stream = await self.add_request(request_id, prompt_token_ids, params, prompt, grammar,
                                        lora_request=lora_request)
        async with aclosing(stream):
            async for out in stream:
                yield out

    async def add_lora(self, lora_request: LoRARequest) -> bool:
        """Read an adapter in on the engine thread (False: it already was); LoRALoadError if it can't be."""
        return await self._call(lambda: self.engine.add_lora(lora_request))

    async def remove_lora(self, lora_int_id: int) -> bool:
        return await self._call(lambda: self.engine.remove_lora(lora_int_id))

    async def list_loras(self) -> set[int]:
        return await self._call(self.engine.list_loras)

    async def embed(self, prompt_token_ids: list[int]) -> list[float]:
        return await self._call(lambda: self.engine.embed(prompt_token_ids))

    async def _call(self, fn: Callable):
        """Run fn on the engine thread; return its result or raise its exception."""
        loop = asyncio.get_running_loop()
        result = loop.create_future()

        def run() -> None:
            try:
                value = fn()
            except BaseException as e:
                loop.call_soon_threadsafe(_settle, result, None, e)
            else:
                loop.call_soon_threadsafe(_settle, result, value, None)

        self._submit(run)
        return await result

    def _submit(self, fn: Callable[[], None]) -> None:
        with self._inbox_lock:
            if self._stopped:
                raise EngineDeadError("the engine has shut down")
            self._inbox.put(fn)
        self._wake.set()

    def shutdown(self) -> None:
        """Stop the engine: requests in flight and calls waiting on it fail with EngineDeadError,
        the compile workers stop. Idempotent; a second caller waits for the first to finish."""
        with self._shutdown_lock:
            self._stop()
            self._wake.set()
            self._thread.join(timeout=30)
            with self._compile_lock:
                self.engine.close()

    def _stop(self) -> None:
        with self._inbox_lock:
            self._stopped = True

    # ---- the engine thread -----------------------------------------------------------------
    def _run(self, config: EngineConfig, loaded: Future) -> None:
        try:
            engine = LLMEngine(config)
        except BaseException as e:  # noqa: BLE001  (re-raised by __init__ on the caller's thread)
            loaded.set_exception(e)
            return
        self.engine = engine
        loaded.set_result(engine)
        try:
            self._loop()
        finally:
            if not self._stopped:
                logger.error("the engine loop exited unexpectedly: the engine is dead")
            self._stop()
            self._drain_inbox()  # what came in before the stop: its calls get their answer
            self._fail_all(EngineDeadError, "the engine has shut down")

    def _loop(self) -> None:
        while not self._stopped:
            self._drain_inbox()
            if not self.engine.has_unfinished_requests():
                self.stats = self.engine.stats()
                self._wake.wait()
                self._wake.clear()
                continue
            try:
                outputs = self.engine.step()
            except EngineDeadError:
                raise  # a tensor-parallel rank failed: the engine cannot step again
            except Exception as e:
                logger.exception("engine step raised: failing every request in flight")
                self._fail_all(RequestFailed, f"the engine step failed ({type(e).__name__}); "
                                              "the engine log has the details")
                continue
            self.stats = self.engine.stats()
            for out in outputs:
                self._deliver(out)

    def _drain_inbox(self) -> None:
        while True:
            try:
                fn = self._inbox.get_nowait()
            except queue.Empty:
                return
            try:
                fn()
            except Exception:
                logger.exception("engine inbox call failed")

    def _deliver(self, out: RequestOutput) -> None:
        stream = self._streams.get(out.request_id)
        if stream is None:
            return
        if out.finished:
            del self._streams[out.request_id]
        for completion in out.outputs:  # the engine keeps appending to these lists
            if completion.logprobs is not None:
                completion.logprobs = list(completion.logprobs)
        _post(*stream, out)

    def _abort(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        self.engine.abort_request(request_id)

    def _fail_all(self, error_type: type[Exception], message: str) -> None:
        """Abort every request, raising error_type(message) in each one's stream."""
        for request_id, (loop, outputs) in list(self._streams.items()):
            self._abort(request_id)
            _post(loop, outputs, error_type(message))
        for request_id in list(self.engine.requests):
            self.engine.abort_request(request_id)


class RequestStream:
    """One request's cumulative outputs, newest first: outputs that piled up while the consumer
    was busy are skipped, since each one contains the ones before it."""

    def __init__(self, llm: AsyncLLM, request_id: str, outputs: asyncio.Queue,
                 on_output: Callable[[RequestOutput], None] | None):
        self.llm, self.request_id, self._outputs, self._on_output = llm, request_id, outputs, on_output
        self.finished = False

    def __aiter__(self) -> "RequestStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        out = await self._outputs.get()
        while not self._outputs.empty():
            out = self._outputs.get_nowait()
        if isinstance(out, BaseException):
            self.close()
            raise out
        if out.finished:
            self._release()
        if out.error is not None:
            raise RequestFailed(out.error)
        if self._on_output is not None:
            self._on_output(out)
        return out

    def close(self) -> None:
        """Abort the request unless it has finished; idempotent."""
        if not self.finished:
            self._release()
            try:
                self.llm._submit(lambda: self.llm._abort(self.request_id))
            except EngineDeadError:
                pass  # a stopped engine has aborted everything

    async def aclose(self) -> None:
        self.close()

    def _release(self) -> None:
        self.finished = True
        self.llm._num_active -= 1

    def __del__(self) -> None:  # a stream dropped unread (e.g. a response cancelled before it began)
        if not self.finished:
            self.close()


def _post(loop: asyncio.AbstractEventLoop, outputs: asyncio.Queue, item: object) -> None:
    """Hand a request's output (or error) to its stream, on the stream's event loop."""
    try:
        loop.call_soon_threadsafe(outputs.put_nowait, item)
    except RuntimeError:  # that loop has closed: nobody reads the stream any more
        pass


def _settle(future: asyncio.Future, value, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)
