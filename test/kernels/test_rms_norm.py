"""The Triton RMSNorm (plain and with the residual add) under the interpreter against its
torch twin, and the twin against transformers' Llama RMSNorm.

The interpreter rounds float32 to bfloat16 by truncation where the GPU rounds to nearest,
so bfloat16 results may differ from the twin's by an ulp per rounding; float16 and float32
are tight.
"""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from vla_sched.kernels.rms_norm import (
    fused_add_rms_norm,
    fused_add_rms_norm_torch,
    rms_norm,
    rms_norm_torch,
    run_fused_add_rms_norm,
    run_rms_norm,
)

EPS = 1e-5
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype
    if actual.dtype == torch.bfloat16:  # an ulp of truncation in the interpreter, see above
        torch.testing.assert_close(actual, expected, rtol=2**-6, atol=1e-5)
    else:
        torch.testing.assert_close(actual, expected)


def _rows(num_tokens: int, hidden: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (3.0 * torch.randn((num_tokens, hidden), generator=generator)).to(dtype)


def _weight(hidden: int, dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(hidden)
    return (1.0 + 0.1 * torch.randn(hidden, generator=generator)).to(dtype)


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('num_tokens,hidden', [(3, 40), (2, 256)])
def test_rms_norm_kernel_matches_its_torch_twin(dtype, num_tokens, hidden):
    x = _rows(num_tokens, hidden, dtype, seed=hidden)
    weight = _weight(hidden, dtype)
    _close(rms_norm(x=x, weight=weight, eps=EPS), rms_norm_torch(x=x, weight=weight, eps=EPS))


@pytest.mark.parametrize('dtype', DTYPES)
def test_fused_add_rms_norm_kernel_matches_its_torch_twin_on_strided_rows(dtype):
    hidden = 40
    x = _rows(3, 2 * hidden, dtype, seed=1)[:, :hidden]  # rows 2 * hidden apart
    residual = _rows(3, hidden, dtype, seed=2)
    weight = _weight(hidden, dtype)
    kept = residual.clone()
    normed, new_residual = fused_add_rms_norm(x=x, residual=residual, weight=weight, eps=EPS)
    ref_normed, ref_residual = fused_add_rms_norm_torch(
        x=x, residual=residual, weight=weight, eps=EPS
    )
    _close(new_residual, ref_residual)
    _close(normed, ref_normed)
    assert torch.equal(residual, kept)  # the inputs are not written


@pytest.mark.parametrize('dtype', DTYPES)
def test_rms_norm_twin_is_transformers_llama_rms_norm(dtype):
    hidden = 40
    x = _rows(5, hidden, dtype, seed=3)
    reference = LlamaRMSNorm(hidden, eps=EPS).to(dtype)
    reference.weight.data.copy_(_weight(hidden, dtype))
    with torch.no_grad():
        expected = reference(x)
    ours = rms_norm_torch(x=x, weight=reference.weight.data, eps=EPS)
    torch.testing.assert_close(ours, expected, rtol=0, atol=0)


def test_fused_add_twin_rounds_the_sum_before_normalizing_it():
    x, residual = _rows(4, 40, torch.bfloat16, 4), _rows(4, 40, torch.bfloat16, 5)
    weight = _weight(40, torch.bfloat16)
    normed, new_residual = fused_add_rms_norm_torch(x=x, residual=residual, weight=weight, eps=EPS)
    assert torch.equal(new_residual, x + residual)
    assert torch.equal(normed, rms_norm_torch(x=x + residual, weight=weight, eps=EPS))


def test_rms_norm_kernel_stays_near_a_float64_reference():
    x, weight = _rows(3, 40, torch.float32, 6), _weight(40, torch.float32)
    x64 = x.double()
    expected = weight.double() * x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + EPS)
    ours = rms_norm(x=x, weight=weight, eps=EPS).double()
    torch.testing.assert_close(ours, expected, rtol=1e-6, atol=1e-6)


def test_no_rows_give_empty_outputs():
    x = torch.empty((0, 40))
    weight = _weight(40, torch.float32)
    assert rms_norm(x=x, weight=weight, eps=EPS).shape == (0, 40)
    normed, new_residual = run_fused_add_rms_norm(
        x=x, residual=x, weight=weight, eps=EPS, backend='triton'
    )
    assert normed.shape == new_residual.shape == (0, 40)


def test_norm_rejects_a_weight_of_another_dtype_naming_it():
    x = _rows(2, 40, torch.float32, 7)
    message = r'weight has dtype torch\.float32 but x has torch\.float16'
    with pytest.raises(TypeError, match=message):
        run_rms_norm(x=x.half(), weight=_weight(40, torch.float32), eps=EPS)


def test_norm_rejects_a_residual_of_another_shape():
    x = _rows(2, 40, torch.float32, 8)
    with pytest.raises(ValueError, match='residual must have shape'):
        fused_add_rms_norm_torch(x=x, residual=x[:1], weight=_weight(40, torch.float32), eps=EPS)
