#!/usr/bin/env bash
# The GPU machine's runs behind docs/benchmarks.md's device figures, in one call:
#
#     scripts/gpu_runs.sh MODE [MODE ...]
#
# run from the checkout there, sent with build/gpu-wheels and build/tokenizer (`make gpu-carry`;
# MaskBench's schemas too, as build/conformance/maskbench-dev, for the agents runs). Each mode
# writes its log (and JSON) under $OUT. Modes:
#   kernels      the Triton kernel tests at real shapes (KERNEL_TESTS from the environment: pytest's
#                arguments selecting some; default all)
#   benches      scripts/gpu_checks.py's decode and prefill kernel timings (bf16 cache, e4m3 cache,
#                fp8 math) against the copy bandwidth and SDPA
#   engine       scripts/gpu_checks.py's engine checks against HF (bf16, unchunked, fp32, fp8 cache,
#                fp8 attention, fp8 weights, AWQ)
#   engine-w4    the engine against HF on 4-bit weights in each GPU layout (GDSERVE_PACKED_LAYOUT)
#   agents       the agents bench (256 schemas), forced text on, then off
#   guided       the standard guided workload, forced text on, then off
#   forced-text  `gdserve bench forced-text` (outputs with and without forced text)
#   w4           scripts/packed_gemm_gpu.py (MS=1,16,64 and SWEEP=0|1 from the environment)
#   w4-e2e       `bench latency` at batch 1 and 64, bf16 against AWQ in each layout (W4_LAYOUTS: some)
#   w4-random    random_workload(), bf16 against AWQ in each layout (W4_LAYOUTS: some)
#   trtllm       scripts/trtllm_rows_gpu.py (ROWS, TRT_MODES and SCALE from the environment)
set -uo pipefail
R=$PWD
T=/tmp/gd
OUT=${OUT:-$R/gpu-results}
mkdir -p "$OUT"

setup() {
    [ -d $T/gdserve ] && return
    pip install -q --no-deps --no-build-isolation --no-index --target $T . build/gpu-wheels/*.whl >/dev/null 2>&1
    (cd /tmp && PYTHONPATH=$T python3 -c "
from transformers import AutoTokenizer, LlamaConfig
from gdserve.bench.workloads import LLAMA3_8B_SHAPE
LlamaConfig(**LLAMA3_8B_SHAPE, vocab_size=49152, architectures=['LlamaForCausalLM']).save_pretrained('/tmp/m')
AutoTokenizer.from_pretrained('$R/build/tokenizer').save_pretrained('/tmp/m')")
}

cli() {  # gdserve from outside the checkout, whose top-level kernels/ would shadow transformers' probe
    (cd /tmp && PYTHONUNBUFFERED=1 PYTHONPATH=$T python3 -m gdserve.entrypoints.cli "$@")
}

schema_dirs() {
    echo "--schema-dir $R/schemas"
    [ -d "$R/build/conformance/maskbench-dev" ] && echo "--schema-dir $R/build/conformance/maskbench-dev"
}

on_off() {  # WORKLOAD: forced text on, then off
    for v in on off; do
        flag=--enable-forced-tokens
        [ $v = off ] && flag=--no-enable-forced-tokens
        echo "=== $1, forced text $v"
        cli bench throughput /tmp/m --workload "$1" --load-format dummy --dtype bfloat16 --num-requests 256 \
            $(schema_dirs) --grammar-mask-workers 14 $flag --output "$OUT/$1_$v.json" 2>&1 | grep -v "it/s" | tail -12
    done
}

w4_layouts() {  # "bf16", "awq rows", "awq mma": the engine's runs of one command per weight format
    local name=$1; shift
    echo "=== $name bf16"; cli "$@" --output-json "$OUT/${name}_bf16.json" 2>&1 | tail -4
    for layout in ${W4_LAYOUTS:-rows mma}; do
        echo "=== $name awq $layout"
        GDSERVE_PACKED_LAYOUT=$layout cli "$@" --quantization awq --output-json "$OUT/${name}_awq_$layout.json" 2>&1 | tail -4
    done
}

run_mode() {
    case $1 in
    kernels)
        # shellcheck disable=SC2086  # KERNEL_TESTS: pytest's arguments, split
        PYTHONUNBUFFERED=1 python3 scripts/gpu_checks.py --no-benches --no-engine -- ${KERNEL_TESTS:-} 2>&1 | tail -30 ;;
    benches)
        PYTHONUNBUFFERED=1 python3 scripts/gpu_checks.py --no-kernel-tests --no-engine 2>&1 | tail -40 ;;
    engine)
        PYTHONUNBUFFERED=1 python3 scripts/gpu_checks.py --no-kernel-tests --no-benches 2>&1 | tail -40 ;;
    engine-w4)
        for layout in rows mma; do
            GDSERVE_PACKED_LAYOUT=$layout PYTHONUNBUFFERED=1 python3 -c "
import json, sys; sys.path.insert(0, 'scripts'); import gpu_checks
gpu_checks.setup_imports(); r = gpu_checks.engine_check(quantization='awq')
print('awq $layout', json.dumps(r)); sys.exit(0 if r['passed'] else 1)"
        done ;;
    agents) setup; on_off agents ;;
    guided) setup; on_off guided ;;
    forced-text)
        setup
        cli bench forced-text /tmp/m --load-format dummy --dtype bfloat16 --schema-dir "$R/schemas" \
            --output "$OUT/forced_text.json" 2>&1 | grep -v "it/s" | tail -20 ;;
    w4)
        PYTHONUNBUFFERED=1 MS=${MS:-1,16,64} SWEEP=${SWEEP:-0} python3 scripts/packed_gemm_gpu.py 2>&1 | tail -80 ;;
    w4-e2e)
        setup
        for batch in 1 64; do
            w4_layouts "latency_b$batch" bench latency /tmp/m --load-format dummy --dtype bfloat16 \
                --input-len 128 --output-len 256 --batch-size $batch --num-iters-warmup 1 --num-iters 3
        done ;;
    w4-random)
        setup
        random_run() {  # NAME [FLAGS]: random_workload() on the 8B shape
            echo "=== random $1"
            cli bench throughput /tmp/m --workload random --load-format dummy --dtype bfloat16 --skip-hf "${@:2}" \
                --output "$OUT/random_$1.json" 2>&1 | grep -v "it/s" | tail -6
        }
        random_run bf16
        for layout in ${W4_LAYOUTS:-rows mma}; do
            GDSERVE_PACKED_LAYOUT=$layout random_run "awq_$layout" --quantization awq
        done ;;
    trtllm)
        PYTHONUNBUFFERED=1 python3 scripts/trtllm_rows_gpu.py --modes "${TRT_MODES:-fp8}" \
            --rows "${ROWS:-2048/2048}" --scale "${SCALE:-1.0}" 2>&1 | grep -v "it/s" | tail -40 ;;
    *)
        echo "unknown mode $1" >&2; return 2 ;;
    esac
}

status=0
for mode in "$@"; do
    echo "##### $mode $(date -u +%H:%M:%S)"
    run_mode "$mode" 2>&1 | tee "$OUT/$mode.log"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
done
exit $status
