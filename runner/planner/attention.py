"""Which attention kernel a job runs, and what that changes in its products' time.

A fused kernel (torch's flash and memory-efficient SDPA, cuDNN's) keeps no scores: backward
computes Q K^T again from the log-sum-exp it kept, five products where forward ran two (Dao,
FlashAttention-2, and its authors' FLOP count). Under the causal mask it computes only the tiles
on and below the diagonal: of an s x s square of query tiles t rows high, (s + t) / (2 s).
torch's math path computes the whole square and keeps it. This runner's ring attention
(runner/layouts/context/ring.py) computes its own block whole, half of each other rank's, and
keeps no scores either. Torch-free."""

from __future__ import annotations

from runner.job import Job
from runner.models.spec import Gemm
from runner.precision import precision_of

# A GPU's fused kernels' query tiles: flash's (16 bits: FlashAttention-2's and -3's forward at
# head size 128, cuDNN's too) and the memory-efficient kernel's (fp32: cutlass's 64 x 64 blocks)
FLASH_QUERY_TILE, EFFICIENT_QUERY_TILE = 128, 64


def fused_attention(job: Job) -> bool:
    """Whether SDPA runs a fused kernel, which keeps no scores: not with trainer.attention=math;
    on a GPU, but for grouped-query attention in fp32 (flash takes 16 bits, the
    memory-efficient kernel no grouped heads); on a CPU, its flash kernel, without dropout."""
    if job.trainer.attention == "math":
        return False
    gpu, m = job.hardware.accelerator != "cpu", job.model
    grouped = m.get("n_kv_heads") not in (None, m.get("n_heads"))
    if gpu:
        return not (grouped and precision_of(job.trainer).activation_bytes == 4)
    return not m.get("dropout", 0)


def query_tile(job: Job, seq_len: int) -> int:
    """The fused kernel's query tile: on a GPU its kernel's (flash in 16 bits, the
    memory-efficient one in fp32); torch's CPU flash kernel picks it by the sequence's length
    (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp: 32, 64 from 192, 256 from 768)."""
    if job.hardware.accelerator != "cpu":
        sixteen_bit = precision_of(job.trainer).activation_bytes == 2
        return FLASH_QUERY_TILE if sixteen_bit else EFFICIENT_QUERY_TILE
    return 256 if seq_len >= 768 else 64 if seq_len >= 192 else 32


def computed_share(job: Job, g: Gemm) -> float:
    """The share of a product's `count` the kernel computes: a causal square's tiles on and
    below the diagonal under a fused kernel outside a ring, all of it otherwise."""
    if not (g.causal and job.mesh.cp == 1 and fused_attention(job)):
        return 1.0
    return min(1.0, (g.m + query_tile(job, g.m)) / (2 * g.m))


def backward_passes(job: Job, g: Gemm) -> int:
    """Products backward runs for one forward product: its input's and its weight's gradients;
    for Q K^T, a third where the kernel kept no scores (fused, or the ring)."""
    return 2 + (g.scores and (job.mesh.cp > 1 or fused_attention(job)))
