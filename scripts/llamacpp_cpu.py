"""The default model (SmolLM2-135M-Instruct) served three ways on the CPU, one after the other, under
the same `gdserve bench serve` load: `gdserve serve` with the dense weights `--dtype auto` picks,
`gdserve serve --quantization gguf` (the Q4_1 file's linear layers kept packed) and llama.cpp's
`llama-server` on the same .gguf file. Each server is started, waited for on /health, loaded,
measured (output tokens/s, TTFT, TPOT, its resident memory after the load) and stopped; the
servers get the same threads, parallel sequences and KV cache tokens (one pool shared by the
sequences). Writes one JSON with the figures and the ratios. Usage:

    python scripts/llamacpp_cpu.py [--llama-server PATH] [--rounds N] [--output FILE]

llama-server comes from `make llama-server` (built from llama-cpp-python's sdist, which vendors
llama.cpp), or --llama-server / $LLAMA_SERVER name one.
"""
import argparse
import datetime
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from gdserve.bench.results import git_commit, write_result
from gdserve.bench.serve import parse_serve_bench_args, run_serve_bench
from gdserve.bench.workloads import REPO_ROOT
from gdserve.models.registry import ALIASES, DEFAULT_MODEL

MAKE_TARGET_BINARY = REPO_ROOT / "build" / "llama.cpp" / "bin" / "llama-server"
INSTALL_HINT = ("build it with `make llama-server` (llama.cpp from llama-cpp-python's sdist, cmake, 15-30 min "
                f"on 2 cores, into {MAKE_TARGET_BINARY.relative_to(REPO_ROOT)}), or pass --llama-server PATH "
                "/ set $LLAMA_SERVER to a llama-server binary")
# SmolLM2-135M: 30 layers, 3 KV heads of 64, 16-bit K and V (llama.cpp's f16, gdserve's bf16).
KV_BYTES_PER_TOKEN = 30 * 2 * 3 * 64 * 2


@dataclass(frozen=True)
class ServerSpec:
    name: str
    argv: list[str]

    def command(self, port: int) -> list[str]:
        return [*self.argv, "--port", str(port)]


def find_llama_server(given: str | None) -> Path:
    """The llama-server binary: the flag, $LLAMA_SERVER, `make llama-server`'s output, then PATH."""
    named = given or os.environ.get("LLAMA_SERVER")
    candidates = [named] if named else [str(MAKE_TARGET_BINARY), shutil.which("llama-server")]
    for candidate in filter(None, candidates):
        path = Path(candidate)
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise SystemExit(f"llama.cpp's server is not installed{f' at {named}' if named else ''}: {INSTALL_HINT}")


def server_specs(llama_server: Path, gguf: Path, args: argparse.Namespace) -> list[ServerSpec]:
    """The three servers, sized alike: `threads` threads, `parallel` sequences at once, a KV cache
    of `ctx` tokens in all."""
    gdserve = [sys.executable, "-m", "gdserve.entrypoints.cli", "serve", DEFAULT_MODEL,
               "--max-num-seqs", str(args.parallel), "--kv-cache-memory", str(args.ctx * KV_BYTES_PER_TOKEN),
               "--log-level", "warning"]
    llama = [str(llama_server), "--model", str(gguf), "--alias", DEFAULT_MODEL, "--host", "127.0.0.1",
             "--threads", str(args.threads), "--threads-batch", str(args.threads),
             "--parallel", str(args.parallel), "--ctx-size", str(args.ctx), "--kv-unified", "--cont-batching"]
    # Repacking is also how llama.cpp reaches AMX; on a VM whose CPU lists AMX without enabling its
    # tile state (ldtilecfg faults: the server dies in its warm-up), it has to stay off.
    llama += [] if args.llama_repack else ["--no-repack"]
    return [ServerSpec("gdserve_dense", gdserve), ServerSpec("gdserve_gguf", gdserve + ["--quantization", "gguf"]),
            ServerSpec("llamacpp", llama)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(spec: ServerSpec, port: int, log: Path, threads: int, timeout_s: float = 300) -> subprocess.Popen:
    """Starts the server in its own process group and waits for /health to answer 200."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    with log.open("w") as out:
        proc = subprocess.Popen(spec.command(port), stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{spec.name} exited with {proc.returncode} before it was ready; its log: {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return proc
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    stop(proc)
    raise SystemExit(f"{spec.name} was not ready within {timeout_s:.0f} s; its log: {log}")


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (its compile workers too), SIGKILL after 30 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def memory_mib(pid: int) -> dict:
    """The process's resident memory now and at its peak, and the resident memory of its process
    group (a server's helper processes), in MiB."""
    status = _status(pid)
    group = [p for p in _pids() if _pgid(p) == os.getpgid(pid)]
    return {"rss_mib": status["VmRSS"] / 1024, "peak_rss_mib": status["VmHWM"] / 1024,
            "group_rss_mib": sum(_status(p).get("VmRSS", 0) for p in group) / 1024, "group_processes": len(group)}


def _status(pid: int) -> dict[str, int]:
    """The kB figures of /proc/PID/status (empty for a process gone meanwhile)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in lines) if v.strip().endswith("kB")}


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def measure(spec: ServerSpec, bench_argv: list[str], threads: int, logs: Path) -> dict:
    print(f"== {spec.name}: {' '.join(spec.argv)}", file=sys.stderr, flush=True)
    port = free_port()
    proc = start(spec, port, logs / f"{spec.name}.log", threads)
    load_average = os.getloadavg()  # the machine is shared: what else ran beside this server
    try:
        result = run_serve_bench(parse_serve_bench_args(["--base-url", f"http://127.0.0.1:{port}/v1",
                                                         "--model", DEFAULT_MODEL, *bench_argv]))
        result |= memory_mib(proc.pid)
    finally:
        stop(proc)
    del result["command"], result["base_url"]
    return {"server_command": " ".join(spec.argv), "load_average_at_start": load_average, **result}


KEPT = ["output_throughput", "total_output_tokens", "completed", "failed", "duration_s", "median_ttft_ms",
        "mean_ttft_ms", "median_tpot_ms", "mean_tpot_ms", "rss_mib", "peak_rss_mib", "group_rss_mib"]


def summarize(rounds: list[dict]) -> dict:
    """One server's rounds: each kept figure's median over them, and the rounds in full."""
    return {**{k: statistics.median(r[k] for r in rounds) for k in KEPT}, "rounds": rounds}


def ratios(servers: dict[str, dict]) -> dict:
    tok_s = {name: s["output_throughput"] for name, s in servers.items()}
    rss = {name: s["rss_mib"] for name, s in servers.items()}
    return {"gguf_over_dense_tok_s": tok_s["gdserve_gguf"] / tok_s["gdserve_dense"],
            "gdserve_gguf_over_llamacpp_tok_s": tok_s["gdserve_gguf"] / tok_s["llamacpp"],
            "gdserve_dense_over_llamacpp_tok_s": tok_s["gdserve_dense"] / tok_s["llamacpp"],
            "gguf_over_dense_rss": rss["gdserve_gguf"] / rss["gdserve_dense"],
            "gdserve_gguf_over_llamacpp_rss": rss["gdserve_gguf"] / rss["llamacpp"]}


def header(llama_server: Path, gguf: Path, args: argparse.Namespace) -> dict:
    version = subprocess.run([str(llama_server), "--version"], capture_output=True, text=True, timeout=30)
    return {"command": " ".join([Path(sys.executable).name, *sys.argv]), "model": DEFAULT_MODEL, "gguf": str(gguf),
            "llama_server": str(llama_server), "llama_server_version": (version.stdout + version.stderr).strip(),
            "threads": args.threads, "parallel": args.parallel, "kv_cache_tokens": args.ctx,
            "machine": _cpu_model(), "cpus": os.cpu_count(), "load_average_at_start": os.getloadavg(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": git_commit()}


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--llama-server", help="llama.cpp's server binary (default: $LLAMA_SERVER, build/llama.cpp, PATH)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="threads of each server")
    p.add_argument("--parallel", type=int, default=8, help="sequences each server runs at once, and the "
                                                           "client's concurrency")
    p.add_argument("--ctx", type=int, default=4096, help="KV cache tokens of each server, all sequences together")
    p.add_argument("--llama-repack", action="store_true",
                   help="let llama.cpp repack weights (its AMX path included), where the CPU's AMX works")
    p.add_argument("--rounds", type=int, default=1, help="measure the three servers this many times, alternating")
    p.add_argument("--num-requests", type=int, help="requests of cpu_workload() (default: its 64)")
    p.add_argument("--output", default="bench-results/llamacpp_cpu.json")
    args = p.parse_args()
    llama_server = find_llama_server(args.llama_server)
    gguf = ALIASES[DEFAULT_MODEL].path()
    result = header(llama_server, gguf, args)
    bench_argv = ["--workload", "cpu", "--max-concurrency", str(args.parallel)]
    bench_argv += ["--num-requests", str(args.num_requests)] if args.num_requests else []
    result["client_command"] = " ".join(["gdserve", "bench", "serve", *bench_argv])
    logs = Path(args.output).with_suffix(".logs")
    logs.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {}
    for _ in range(args.rounds):
        for spec in server_specs(llama_server, gguf, args):
            runs.setdefault(spec.name, []).append(measure(spec, bench_argv, args.threads, logs))
    result["servers"] = {name: summarize(rounds) for name, rounds in runs.items()}
    result["ratios"] = ratios(result["servers"])
    write_result(result, args.output)
    _print(result)


def _print(result: dict) -> None:
    print(f"{'server':15} {'tok/s':>8} {'tokens':>7} {'TTFT ms':>8} {'TPOT ms':>8} {'RSS MiB':>8}")
    for name, s in result["servers"].items():
        print(f"{name:15} {s['output_throughput']:8.1f} {s['total_output_tokens']:7.0f} {s['median_ttft_ms']:8.1f} "
              f"{s['median_tpot_ms']:8.1f} {s['rss_mib']:8.1f}"
              + (f"  ({s['failed']:.0f} requests failed: see the JSON)" if s["failed"] else ""))
    for name, value in result["ratios"].items():
        print(f"{name}: {value:.3f}")


if __name__ == "__main__":
    main()
