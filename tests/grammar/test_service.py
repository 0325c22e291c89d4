"""CompileService: worker processes, cache, timeout, crash recovery."""
import os
import subprocess
import sys
import textwrap
import time
from concurrent.futures import wait

import pytest

from gdserve.grammar import GrammarError, compile_grammar
from gdserve.grammar.compile_worker import TrieUnpickler
from gdserve.grammar.service import CompileService, CompilerUnavailableError
from tests.entrypoints.openai.observe import is_running, wait_until
from tests.grammar.walk import allowed_ids
from tests.helpers import SLOW_SCHEMA

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
          "required": ["a"]}


@pytest.fixture(scope="module")
def service(smollm2_tokenizer):
    with CompileService(smollm2_tokenizer, max_workers=2, timeout_s=30.0) as svc:
        yield svc


def test_compiles_in_workers_like_in_process(service, smollm2_tokenizer):
    remote = service.compile("regex", r"[0-9]{3}-[a-z]+")
    local = compile_grammar("regex", r"[0-9]{3}-[a-z]+", smollm2_tokenizer)
    assert (remote.kind, remote.regex, remote.vocab_size) == (local.kind, local.regex, 49152)
    m_remote, m_local = remote.matcher(), local.matcher()
    for token in smollm2_tokenizer.encode("123-abc", add_special_tokens=False):
        assert allowed_ids(m_remote) == allowed_ids(m_local)
        assert m_remote.accept_token(token) and m_local.accept_token(token)
    assert m_remote.accept_token(2)
    assert service.worker_pids() and os.getpid() not in service.worker_pids()


def test_cache_hits_are_immediate_and_identical(service):
    first = service.submit("json", SCHEMA)
    grammar = first.result()
    reordered = {"required": ["a"], "type": "object",
                 "properties": {"b": {"type": "string"}, "a": {"type": "integer"}}}
    start = time.perf_counter()
    again = service.submit("json", reordered)
    assert again is first and again.done() and again.result() is grammar
    assert time.perf_counter() - start < 0.01
    assert service.submit("json", SCHEMA, lenient=True) is not first  # options are in the key
    as_list, as_tuple = service.submit("choice", ["x", "y"]), service.submit("choice", ("x", "y"))
    assert as_list.result() is as_tuple.result()


def test_parallel_submits(service):
    specs = [("regex", rf"[a-z]{{{n}}}") for n in range(1, 7)] + [("choice", ["p", "q"])]
    futures = [service.submit(kind, spec) for kind, spec in specs]
    assert service.submit(*specs[0]) is futures[0]  # in flight: the same future
    done, not_done = wait(futures, timeout=60)
    assert not not_done
    assert [f.result().regex for f in futures] == [spec if kind == "regex" else "(p|q)"
                                                   for kind, spec in specs]


def test_compile_errors_come_back_and_are_cached(service):
    failed = service.submit("regex", r"(?=x)y")
    with pytest.raises(GrammarError, match="lookaround"):
        failed.result()
    assert service.submit("regex", r"(?=x)y") is failed
    with pytest.raises(GrammarError, match="invalid Lark grammar"):
        service.compile("grammar", "start: (")
    with pytest.raises(TypeError, match="unknown compile options"):
        service.submit("regex", "a", vocab_size=3)


def test_timeout_kills_the_worker_then_compiles_again(smollm2_tokenizer):
    with CompileService(smollm2_tokenizer, timeout_s=1.0) as svc:
        assert svc.compile("choice", ["warm"]).regex == "(warm)"
        worker = svc.worker_pids()[0]
        start = time.perf_counter()
        with pytest.raises(GrammarError, match=r"timed out after 1.0 s"):
            svc.compile("json", SLOW_SCHEMA)
        assert time.perf_counter() - start < 3.0
        assert svc.compile("regex", "[0-9]+").regex == "[0-9]+"  # on a fresh worker
        assert worker not in svc.worker_pids()
        with pytest.raises(OSError):
            os.kill(worker, 0)  # killed
        assert svc.submit("json", SLOW_SCHEMA).exception() is not None  # cached failure, no new run


def test_killed_worker_fails_its_job_then_compiles_again(smollm2_tokenizer):
    with CompileService(smollm2_tokenizer, timeout_s=30.0) as svc:
        svc.compile("choice", ["warm"])
        future = svc.submit("json", SLOW_SCHEMA)
        time.sleep(0.5)
        os.kill(svc.worker_pids()[0], 9)
        with pytest.raises(CompilerUnavailableError, match="worker died"):
            future.result(timeout=10)
        assert svc.compile("choice", ["after"]).regex == "(after)"


def test_close_fails_pending_and_refuses_new(smollm2_tokenizer):
    svc = CompileService(smollm2_tokenizer, timeout_s=30.0)
    future = svc.submit("json", SLOW_SCHEMA)
    svc.close()
    with pytest.raises(CompilerUnavailableError, match="closed"):
        future.result(timeout=5)
    with pytest.raises(RuntimeError, match="closed"):
        svc.submit("regex", "a")

def test_workers_start_on_demand_up_to_max_workers(smollm2_tokenizer):
    with CompileService(smollm2_tokenizer, max_workers=2, timeout_s=60.0) as svc:
        assert svc.worker_pids() == []  # nothing compiled yet: no worker
        svc.compile("choice", ["one"])
        assert len(svc.worker_pids()) == 1  # one job at a time: one worker serves it
        start = time.monotonic()
        futures = [svc.submit("regex", rf"[a-z]{{{n}}}x") for n in range(1, 6)]
        assert time.monotonic() - start < 1.0  # submit returned without waiting for a worker's start (seconds)
        done, not_done = wait(futures, timeout=120)
        assert not not_done and all(f.exception() is None for f in futures)
        wait_until(lambda: len(svc.worker_pids()) == 2, 60, "a second worker for the queued jobs")


def test_a_worker_that_cannot_start_fails_the_waiting_jobs_then_a_later_submit_retries(
        smollm2_tokenizer, monkeypatch):
    with CompileService(smollm2_tokenizer, timeout_s=30.0) as svc:
        monkeypatch.setattr(sys, "executable", "/bin/false")  # the worker exits at once
        future = svc.submit("regex", "[a-c]+")
        with pytest.raises(CompilerUnavailableError, match="failed to start: exit code 1"):
            future.result(timeout=30)
        monkeypatch.undo()
        assert svc.compile("regex", "[a-c]+").regex == "[a-c]+"  # not cached: a fresh worker


def test_a_worker_dies_with_its_parent(tiny_llama_dir, tmp_path):
    """A parent killed while its worker compiles leaves no orphan behind."""
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, time
        from gdserve.grammar.service import CompileService
        from gdserve.models.loader import load_tokenizer

        service = CompileService(load_tokenizer({str(tiny_llama_dir)!r}), timeout_s=120)
        service.submit("json", {SLOW_SCHEMA!r})
        while not service.worker_pids():
            time.sleep(0.05)
        print(service.worker_pids()[0], flush=True)
        time.sleep(0.5)  # the job on its way to the worker
        os.kill(os.getpid(), signal.SIGKILL)
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr[-3000:]
    worker = int(proc.stdout.split()[0])
    wait_until(lambda: not is_running(worker), 10, f"the orphaned worker {worker} gone")


def test_disk_cache_survives_a_restart(smollm2_tokenizer, tmp_path):
    recursive = {"$defs": {"node": {"type": "object", "properties": {"kids": {"type": "array",
                 "items": {"$ref": "#/$defs/node"}}}}}, "$ref": "#/$defs/node"}
    with CompileService(smollm2_tokenizer, timeout_s=30.0, cache_dir=tmp_path) as svc:
        compiled = [svc.compile("json", SCHEMA), svc.compile("json", recursive), svc.compile("regex", "ab+")]
    files = list(tmp_path.rglob("*.pkl"))
    assert len(files) == 3  # written before close returned
    with CompileService(smollm2_tokenizer, timeout_s=30.0, cache_dir=tmp_path) as svc:
        futures = [svc.submit("json", SCHEMA), svc.submit("json", recursive), svc.submit("regex", "ab+")]
        assert all(f.done() for f in futures)  # no compile: read back from disk
        for before, future in zip(compiled, futures):
            after = future.result()
            assert type(after) is type(before) and after.report == before.report
            assert allowed_ids(after.matcher()) == allowed_ids(before.matcher())
        assert not svc.submit("json", SCHEMA, lenient=True).done()  # other options: another key
        # a damaged file is dropped and the constraint compiled again
        for f in files:
            f.write_bytes(b"not a pickle")
    with CompileService(smollm2_tokenizer, timeout_s=30.0, cache_dir=tmp_path) as svc:
        future = svc.submit("regex", "ab+")
        assert not future.done()
        assert future.result().regex == compiled[2].regex


def test_payloads_are_kept_only_when_asked_taken_once_and_bounded(smollm2_tokenizer, monkeypatch):
    with CompileService(smollm2_tokenizer) as plain:
        assert plain.take_payload(plain.compile("regex", "[a-z]+")) is None
    with CompileService(smollm2_tokenizer, keep_payloads=True) as service:
        grammar = service.compile("json", SCHEMA)
        payload = service.take_payload(grammar)
        copy = TrieUnpickler(payload, service.trie).load()
        assert (copy.kind, copy.regex) == (grammar.kind, grammar.regex)
        assert service.take_payload(grammar) is None  # taken
        assert service.take_payload(service.compile("json", SCHEMA)) is None  # a cache hit: none kept
    monkeypatch.setattr("gdserve.grammar.service.PAYLOAD_BUDGET_BYTES", len(payload) + 1)
    with CompileService(smollm2_tokenizer, keep_payloads=True) as service:
        first, second = service.compile("json", SCHEMA), service.compile("regex", "[0-9]{4}")
        assert service.take_payload(first) is None  # dropped for the newer one
        assert service.take_payload(second) is not None
