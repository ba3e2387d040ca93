"""The Triton SiLU-and-mul under the interpreter against its torch twin and float64.

The interpreter rounds float32 to bfloat16 by truncation where the GPU rounds to nearest,
so bfloat16 results may differ from the twin's by an ulp per rounding; float16 and float32
are tight.
"""

from __future__ import annotations

import pytest
import torch

from vla_sched.kernels._activation_jit import MAX_BLOCK
from vla_sched.kernels.activation import run_silu_and_mul, silu_and_mul, silu_and_mul_torch

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _gate_up(num_tokens: int, inner: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (3.0 * torch.randn((num_tokens, 2 * inner), generator=generator)).to(dtype)


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('num_tokens,inner', [(3, 37), (2, MAX_BLOCK + 40)])
def test_silu_and_mul_kernel_matches_its_torch_twin(dtype, num_tokens, inner):
    gate_up = _gate_up(num_tokens, inner, dtype, seed=inner)
    ours = silu_and_mul(gate_up=gate_up)
    expected = silu_and_mul_torch(gate_up=gate_up)
    assert ours.shape == (num_tokens, inner)
    if dtype == torch.bfloat16:  # an ulp of truncation in the interpreter, see above
        torch.testing.assert_close(ours, expected, rtol=2**-6, atol=1e-5)
    else:
        torch.testing.assert_close(ours, expected)


def test_silu_and_mul_kernel_reads_strided_rows_near_float64():
    gate_up = _gate_up(3, 48, torch.float32, seed=1)[:, :40]  # inner 20, rows 96 apart
    gate, up = gate_up.double().chunk(2, dim=-1)
    expected = gate / (1.0 + torch.exp(-gate)) * up
    ours = run_silu_and_mul(gate_up=gate_up, backend='triton')
    torch.testing.assert_close(ours.double(), expected, rtol=1e-6, atol=1e-6)


def test_silu_and_mul_twin_is_silu_of_the_first_half_times_the_second():
    gate_up = _gate_up(4, 24, torch.bfloat16, seed=2)
    gate, up = gate_up[:, :24], gate_up[:, 24:]
    assert torch.equal(silu_and_mul_torch(gate_up=gate_up), torch.nn.functional.silu(gate) * up)


def test_silu_and_mul_of_no_tokens_is_empty():
    assert silu_and_mul(gate_up=torch.empty((0, 8))).shape == (0, 4)


def test_silu_and_mul_rejects_an_odd_width():
    with pytest.raises(ValueError, match='even last dimension'):
        run_silu_and_mul(gate_up=torch.zeros((2, 7)))
