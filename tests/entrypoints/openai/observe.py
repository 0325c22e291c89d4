"""How the load and fault tests watch a server from outside: its streamed completions (read to the
end, whatever the end is) and its process in /proc (memory, compile workers, liveness)."""
import json
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx


@dataclass
class StreamResult:
    """What one streamed /v1/completions request came back with."""
    status: int
    error: dict | None = None           # the error object: of a refused request, or in-band
    texts: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict | None = None
    done: bool = False                  # the stream ended with `data: [DONE]`

    @property
    def completed(self) -> bool:
        return self.status == 200 and self.done and self.error is None and self.finish_reason is not None

    @property
    def num_tokens(self) -> int:
        return self.usage["completion_tokens"] if self.usage else 0


def completion_body(prompt: str, max_tokens: int, **extra) -> dict:
    """A streamed completion that generates exactly max_tokens tokens, usage included."""
    return {"model": "test-model", "prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}, **extra}


async def stream_completion(client: httpx.AsyncClient, body: dict,
                            on_chunk: Callable[[StreamResult], Awaitable[bool]] | None = None) -> StreamResult:
    """POST a streamed completion and read it to its end. on_chunk, awaited after each event, may
    return False to hang up there (the result then has done=False)."""
    async with client.stream("POST", "/v1/completions", json=body) as response:
        result = StreamResult(response.status_code)
        if response.status_code != 200:
            result.error = json.loads(await response.aread())["error"]
            return result
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                result.done = True
                continue
            _take_event(result, json.loads(line[len("data: "):]))
            if on_chunk is not None and not await on_chunk(result):
                return result
    return result


def _take_event(result: StreamResult, event: dict) -> None:
    if "error" in event:
        result.error = event["error"]
        return
    for choice in event["choices"]:
        result.texts.append(choice["text"])
        result.finish_reason = choice["finish_reason"] or result.finish_reason
    result.usage = event.get("usage") or result.usage


# ---- /proc ---------------------------------------------------------------------------------
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def children(pid: int) -> list[int]:
    """The live child processes of pid (by the parent pid in each /proc/PID/stat)."""
    pids = [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]
    return [p for p in pids if _stat_fields(p)[1:2] == [str(pid).encode()] and is_running(p)]


def compile_workers(server_pid: int) -> list[int]:
    """The server's grammar compile workers: its children running gdserve.grammar.compile_worker."""
    return [p for p in children(server_pid) if b"gdserve.grammar.compile_worker" in _read(f"/proc/{p}/cmdline")]


def exists(pid: int) -> bool:
    """pid exists, as a zombie too (dead, not yet reaped by its parent)."""
    return bool(_stat_fields(pid))


def is_running(pid: int) -> bool:
    """pid exists and is not a zombie (a dead child nobody has reaped yet)."""
    state = _stat_fields(pid)[:1]
    return bool(state) and state != [b"Z"]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time pid has used."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(interval_s)


def _stat_fields(pid: int) -> list[bytes]:
    """/proc/PID/stat after the command name: state, ppid, ...; [] once pid is gone."""
    stat = _read(f"/proc/{pid}/stat")
    return stat.rsplit(b")", 1)[1].split() if stat else []


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return b""

