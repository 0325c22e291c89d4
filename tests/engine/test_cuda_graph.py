"""CUDA graph buckets: every decode batch up to max_num_seqs has a captured size to pad to. (The
graphs themselves run on CUDA only: scripts/gpu_checks.py checks the engine with them against HF.)"""
import pytest

from gdserve.engine.cuda_graph import batch_buckets


@pytest.mark.parametrize("max_num_seqs", [1, 3, 5, 16, 17, 100, 256, 300, 1024])
def test_every_batch_size_has_a_bucket(max_num_seqs):
    buckets = batch_buckets(max_num_seqs)
    assert buckets == sorted(set(buckets)) and buckets[-1] == max_num_seqs
    for n in range(1, max_num_seqs + 1):
        padded = next(b for b in buckets if b >= n)
        assert padded - n < (16 if n <= 256 else 32) and (n > 8 or padded <= 2 * n)
