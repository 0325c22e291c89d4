"""Device diagnostic: which Triton op moves the engine's bf16 logprobs away from float32 truth.
Runs the engine check once per GDSERVE_NO_TRITON setting (each in a fresh process)."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ["", "all", "paged_attention", "rms_norm", "rotary", "kv_cache"]

if __name__ == "__main__" and len(sys.argv) == 1:
    for v in VARIANTS:
        env = dict(os.environ, GDSERVE_NO_TRITON=v)
        out = subprocess.run([sys.executable, __file__, "one"], env=env, capture_output=True, text=True)
        print(f"no triton for [{v or 'none'}]:", out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-800:], flush=True)
elif __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "scripts"))
    import test_gpu
    test_gpu.setup_imports()
    r = test_gpu.engine_check(steps=4)
    print(json.dumps({k: r.get(k) for k in ("first_token_logprob_abs_err_max", "ours_bf16_vs_hf_fp32_first_logprob_err_max",
                                             "hf_bf16_vs_hf_fp32_logprob_err_max", "identical_fraction")}))
