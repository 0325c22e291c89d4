import torch

from gdserve.kernels.fp8_gemm import fp8_gemm_reference
from gdserve.kernels.packed_gemm import packed_gemm_reference, to_mma
from gdserve.kernels.quant import quant_fp8_rowwise_reference
from tests.kernels.test_triton_packed_gemm import HALF, assert_close_to, packed_weight
from tests.kernels.triton_cases import randn, requires_triton

pytestmark = requires_triton


def test_gemms_split_over_k_leave_the_workspace_clean():
    """The programs of a tile add into the device's float32 workspace and the last one stores the
    output and zeroes its sums and count: GEMMs of other shapes and kernels after it start clean
    and come out right."""
    from gdserve.kernels.triton.fp8_gemm import fp8_gemm_triton
    from gdserve.kernels.triton.packed_gemm import packed_gemm_triton
    from gdserve.kernels.triton.packed_gemm_mma import packed_gemm_mma_triton
    from gdserve.kernels.triton.split_k import _WORKSPACES
    rows, mma = packed_weight(256, 48, 4, 128, HALF), to_mma(packed_weight(256, 80, 4, 128, HALF, seed=2))
    w8, w8_scale = quant_fp8_rowwise_reference(randn(64, 256, seed=3, scale=0.02).float())
    w8_scale = w8_scale.t().contiguous()

    def fp8(x):
        a, a_scale = quant_fp8_rowwise_reference(x.float())
        out = fp8_gemm_triton(a, a_scale, w8, w8_scale, x.dtype, (16, 32, 64, 3, 4, 2))
        return out, fp8_gemm_reference(a, a_scale, w8, w8_scale, torch.float32)

    runs = [lambda x: (packed_gemm_triton(x, rows.qweight, rows.scales, rows.biases, 4, 128, (16, 32, 128, 2, 4, 2)),
                       packed_gemm_reference(x, rows)),
            lambda x: (packed_gemm_mma_triton(x, mma.qweight, mma.scales, mma.biases, 128, (16, 64, 2, 4, 2, True)),
                       packed_gemm_reference(x, mma)),
            lambda x: (packed_gemm_triton(x, rows.qweight, rows.scales, rows.biases, 4, 128, (32, 128, 2, 4)),
                       packed_gemm_reference(x, rows)),
            fp8]
    for m in (3, 19, 1):
        for run in runs:
            x = randn(m, 256, dtype=HALF)
            out, expected = run(x)
            assert out.dtype == x.dtype and out.shape[0] == m
            if run is fp8:
                torch.testing.assert_close(out.float(), expected, atol=2 ** -8 * expected.abs().max().item(),
                                           rtol=2 ** -6)
            else:
                assert_close_to(out, expected)
            space = _WORKSPACES[x.device][-1]
            assert not space.sums.any() and not space.locks.any()
