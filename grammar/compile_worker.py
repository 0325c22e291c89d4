"""A grammar compile worker process, and the service's handle on it (CompileService's lanes).

The worker is a plain subprocess of the same interpreter, never a multiprocessing child: it
imports this module (with the parent's sys.path, so it finds the same gdserve) and nothing of
the parent's __main__, so a script that builds an engine at module level, without the
`if __name__ == "__main__":` guard, neither fails nor loads its model twice.

It talks to the service over a socket pair, one pickled message at a time
(multiprocessing.connection framing):
    service -> worker: (TokenVocabulary, memory_limit_mb) once, then (kind, spec, options, vocab_size)
    worker -> service: its pid once ready, then a Grammar or a GrammarError per job
A grammar's token trie travels as its vocabulary's fingerprint (pickle's persistent ids): the
service holds the same trie, and a few MB of arrays per compile would cost milliseconds each way.

No orphans: the worker exits when the service's end of the socket closes (between jobs), and on
Linux the kernel kills it when the thread that started it (its lane's thread, which outlives it)
or its whole parent dies, even mid-compile (PR_SET_PDEATHSIG).
"""
import ctypes
import io
import os
import pickle
import resource
import signal
import socket
import subprocess
import sys
from multiprocessing.connection import Connection, wait

from gdserve.grammar.compiler import compile_with_vocabulary
from gdserve.grammar.errors import GrammarError
from gdserve.grammar.matcher import Grammar
from gdserve.grammar.token_index import TokenTrie, token_trie
from gdserve.grammar.vocabulary import TokenVocabulary
from gdserve.utils import settle_gc

MODULE = "gdserve.grammar.compile_worker"
# Run by `python -c`: take the parent's sys.path, then serve on the inherited socket fd.
BOOTSTRAP = ("import sys, importlib; sys.path[:] = sys.argv[4:]; "
             "importlib.import_module(sys.argv[3]).main(int(sys.argv[1]), int(sys.argv[2]))")
PR_SET_PDEATHSIG = 1


class WorkerDied(Exception):
    """The worker process is gone (killed, out of memory, or it could not start)."""


# ---- worker side -------------------------------------------------------------------------------
def main(fd: int, parent_pid: int) -> None:
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the parent, which then closes us
    conn = Connection(fd)
    try:
        vocab, memory_limit_mb = conn.recv()
        load_vocabulary(vocab, memory_limit_mb)
        conn.send(os.getpid())
        while True:
            kind, spec, options, vocab_size = conn.recv()
            _send_result(conn, _compile(vocab, kind, spec, options, vocab_size))
    except (EOFError, OSError):  # the service closed its end, or its process is gone
        pass


def die_with_parent(parent_pid: int) -> None:
    """Linux: SIGKILL this process when the thread that started it exits; exit now if the parent
    is already gone (it may have died before the request took effect)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(0)


def load_vocabulary(vocab: TokenVocabulary, memory_limit_mb: int | None) -> None:
    """Build the token trie every compile walks, yield the CPU to the engine (nice 10), and cap
    the address space at its current size + memory_limit_mb (an index that explodes then fails
    its compile instead of pushing the host into the OOM killer)."""
    os.nice(10)
    token_trie(vocab.token_bytes, vocab.fingerprint)
    settle_gc()
    if memory_limit_mb is not None:
        mapped = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        limit = mapped + memory_limit_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))


def _compile(vocab: TokenVocabulary, kind: str, spec: object, options: dict,
             vocab_size: int | None) -> Grammar | GrammarError:
    try:
        return compile_with_vocabulary(kind, spec, vocab, vocab_size=vocab_size, **options)
    except GrammarError as e:
        return e
    except BaseException as e:  # incl. Rust panics and MemoryError: report them as a failed compile
        return GrammarError(f"{kind} compile failed: {type(e).__name__}: {e}")


class TriePickler(pickle.Pickler):
    def persistent_id(self, obj: object) -> str | None:
        return obj.fingerprint if isinstance(obj, TokenTrie) else None


class TrieUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, trie: TokenTrie):
        super().__init__(io.BytesIO(data))
        self.trie = trie

    def persistent_load(self, fingerprint: str) -> TokenTrie:
        if fingerprint != self.trie.fingerprint:
            raise pickle.UnpicklingError(f"the grammar's tokenizer {fingerprint} is not the service's")
        return self.trie


def _send_result(conn: Connection, result: Grammar | GrammarError) -> None:
    buffer = io.BytesIO()
    try:
        TriePickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(result)
        payload = buffer.getvalue()
    except Exception as e:  # noqa: BLE001 (a grammar that cannot travel is a failed compile)
        payload = pickle.dumps(GrammarError(f"compiled grammar cannot be sent back: {type(e).__name__}: {e}"))
    conn.send_bytes(payload)


# ---- service side ------------------------------------------------------------------------------
class WorkerProcess:
    """The service's end of one worker: start it, ship the vocabulary, run one job at a time.
    A lane's thread owns it: start() and every blocking call come from that thread."""

    def __init__(self, process: subprocess.Popen, conn: Connection):
        self.process = process
        self.conn = conn

    @property
    def pid(self) -> int:
        return self.process.pid

    @classmethod
    def start(cls, module: str = MODULE) -> "WorkerProcess":
        """Start the process running `module`'s main(fd, parent_pid) (it then imports
        gdserve.grammar; handshake() waits for it)."""
        ours, theirs = socket.socketpair()
        with theirs:
            process = subprocess.Popen(
                [sys.executable, "-c", BOOTSTRAP, str(theirs.fileno()), str(os.getpid()), module, *sys.path],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        return cls(process, Connection(ours.detach()))

    def handshake(self, vocab_message: bytes) -> None:
        """Send the pickled (vocabulary, memory limit); return once the worker is ready for jobs.
        Raises WorkerDied."""
        try:
            self.conn.send_bytes(vocab_message)
            self.conn.recv()
        except (EOFError, OSError):
            raise WorkerDied(f"exit code {self.process.wait()}; its error, if any, is on stderr") from None

    def compile(self, kind: str, spec: object, options: dict, vocab_size: int | None,
                timeout_s: float, trie: TokenTrie) -> tuple[Grammar, bytes] | GrammarError | None:
        """The job's Grammar (on `trie`, the vocabulary's) and the bytes it came in (what a mask
        worker loads, grammar/matcher_pool.py), or GrammarError; None when timeout_s passed first
        (the worker is still busy: kill it). Raises WorkerDied."""
        try:
            self.conn.send((kind, spec, options, vocab_size))
            if not self.conn.poll(timeout_s):
                return None
            message = self.conn.recv_bytes()
        except (EOFError, OSError):
            raise WorkerDied from None
        try:
            result = TrieUnpickler(message, trie).load()
        except Exception as e:  # noqa: BLE001 (read whole: the stream is still in step)
            return GrammarError(f"{kind} compiled grammar cannot be read back: {type(e).__name__}: {e}")
        return result if isinstance(result, GrammarError) else (result, message)

    def wait_idle(self, wakeup_fd: int) -> bool:
        """Block while the worker idles until wakeup_fd is readable (True), or the worker dies
        (False: a worker never writes unasked, so its end readable means it has closed)."""
        ready = wait([self.conn, wakeup_fd])
        return self.conn not in ready

    def kill(self) -> None:
        """SIGKILL (it may be stuck in a compile); any thread may call it. The lane's thread,
        blocked on the socket, then sees it closed."""
        self.process.kill()

    def close(self) -> None:
        """Kill and reap the worker, close the socket (the owning lane's thread only)."""
        self.process.kill()
        self.process.wait()
        self.conn.close()
