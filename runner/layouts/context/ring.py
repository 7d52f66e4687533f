"""Ring attention: causal attention over a sequence split across the cp ranks, each rank holding
the queries of its own positions, keys and values passed around the ring (Liu et al. 2023;
picotron's and Megatron-LM's context parallelism), here with P2P sends over the cp group.

Forward, in cp steps: a rank attends its queries to the keys and values it holds (its own first),
while it sends them to the next rank and receives the previous rank's; the blocks' results are
merged by their log-sum-exp (the online softmax flash attention uses), so the output is exactly
softmax(QK^T)V over every position before each query. Backward, in cp steps again: the keys and
values go around once more, and beside them the gradients of each rank's keys and values,
accumulated by every rank their queries saw and arriving home after the last step. Each exchange
is launched before the block's compute and waited for after it: what the compute does not hide
is the time the rank was blocked. Of each block only the rows and columns the causal mask leaves
visible are computed (`box`: half of every block but the rank's own, under the head-tail
layout), their products on inputs in the layers' dtype, as a flash kernel's, the softmax and
the merge in fp32.
Under grouped-query attention K and V travel with their own heads and serve their query heads on
arrival; their gradients are summed back into them.

Per block and micro-batch of b samples, with h/tp of the model's width on each rank (of the
key/value width under grouped-query attention): forward (cp-1) exchanges of K and V,
b*(s/cp)*h/tp values each, in the dtype attention computes in;
backward (cp-1) of K and V again and cp of their gradients, fp32 (summed across ranks). The
planner counts the same (runner/layouts/context/traffic.py). Only Q, K, V, the output and the
log-sum-exp are kept for backward (and the dropout masks, with dropout), not the blocks' scores.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from runner import clock
from runner.layouts.context import probe
from runner.layouts.probes import Transfer

Tensors = tuple[torch.Tensor, ...]


class Ring:
    """The cp ranks of this rank's ring, and its neighbours on it (global ranks)."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        ranks = dist.get_process_group_ranks(group)
        self.group, self.size = group, len(ranks)
        self.index = ranks.index(dist.get_rank())
        self.next = ranks[(self.index + 1) % self.size]
        self.prev = ranks[(self.index - 1) % self.size]

    def start(self, tensors: Tensors, tag: int) -> tuple[Tensors, list[Any], Any, int]:
        """Send `tensors` to the next rank and receive their likes from the previous one."""
        launched = clock.stamp()
        tensors = tuple(t.contiguous() for t in tensors)
        received = tuple(torch.empty_like(t) for t in tensors)
        ops = [dist.P2POp(dist.isend, t, self.next, self.group, tag + i)
               for i, t in enumerate(tensors)]  # fmt: skip
        ops += [dist.P2POp(dist.irecv, r, self.prev, self.group, tag + i)
                for i, r in enumerate(received)]  # fmt: skip
        sent = sum(t.numel() * t.element_size() for t in tensors)
        return received, dist.batch_isend_irecv(ops), launched, sent

    @staticmethod
    def finish(pending: tuple[Tensors, list[Any], Any, int]) -> Tensors:
        received, works, launched, sent = pending
        waited = clock.stamp()
        for work in works:
            work.wait()
        done = clock.stamp()
        probe.report(
            Transfer("cp", "cp send-recv", launched, done, sent, blocking=False, apart=True),
            Transfer("cp", "cp wait", waited, done),
        )
        return received


# The exchanges' tags, each tensor of an exchange its own (tag, tag + 1): in backward an exchange
# of keys and values and one of their gradients are in flight at once, between the same ranks.
KV, GRADS = 0, 2


def layout(seq_len: int, cp: int) -> list[list[int]]:
    """Each cp rank's positions, load-balanced for causal attention (torchtitan's head-tail split):
    the sequence cut into 2cp chunks, rank r holding chunk r and chunk 2cp-1-r, so that every rank
    has as many (query, key) pairs under the causal mask as the others."""
    c = seq_len // (2 * cp)
    return [
        [*range(r * c, (r + 1) * c), *range((2 * cp - 1 - r) * c, (2 * cp - r) * c)]
        for r in range(cp)
    ]


class RingAttention:
    """Called where the model calls scaled_dot_product_attention (causal), on this rank's
    positions of the sequence; the ring's other ranks call it at the same time."""

    def __init__(self, ring: Ring, seq_len: int) -> None:
        self.ring = ring
        positions = torch.tensor(layout(seq_len, ring.size))
        self.mine = mine = positions[ring.index]  # this rank's positions
        # the block held at step j (rank index - j's): which of its keys each query sees
        self.boxes = [
            box(positions[(ring.index - j) % ring.size][None, :] <= mine[:, None])
            for j in range(ring.size)
        ]

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = True,
        dropout_p: float = 0.0, enable_gqa: bool = False,
    ) -> torch.Tensor:  # fmt: skip
        if any(m is not None and m.device != q.device for *_, m in self.boxes):
            # once: not a copy to the device per block
            self.boxes = [(r, c, m if m is None else m.to(q.device)) for r, c, m in self.boxes]
        # The blocks' softmax and merge in fp32 whatever autocast computes the layers in (its
        # kernels do the same); K and V travel as the layers made them.
        with torch.autocast(q.device.type, enabled=False):
            return _RingAttention.apply(q, k, v, self, dropout_p)


Box = tuple[slice, slice, "torch.Tensor | None"]


def box(visible: torch.Tensor) -> Box:
    """The rows (queries) and columns (keys) of a block that hold every pair the causal mask
    leaves visible, and the mask within them (None: all of it visible). Under the head-tail
    layout a block from an earlier rank is visible to every query in its first half of keys, one
    from a later rank to the second half of queries in all its keys: half the block, computed
    alone; a rank's own block is causal within."""
    rows, cols = visible.any(1).nonzero(), visible.any(0).nonzero()
    r, c = slice(int(rows[0]), int(rows[-1]) + 1), slice(int(cols[0]), int(cols[-1]) + 1)
    inside = visible[r, c]
    return r, c, None if bool(inside.all()) else inside


def _mm(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A product of inputs in the layers' dtype, as a flash kernel takes them; its result in fp32
    for the softmax and the merge (rounded to that dtype first, where flash keeps its
    accumulator: torch's CPU products give no fp32 result of 16-bit inputs)."""
    return (a.to(dtype) @ b.to(dtype)).float()


def _scores(q: torch.Tensor, k: torch.Tensor, visible: torch.Tensor | None) -> torch.Tensor:
    """The scores of one block, scaled (the queries before the product, as SDPA's math path
    does: fp16 scores stay in range), -inf where the causal mask hides a key."""
    scores = _mm(q / math.sqrt(q.shape[-1]), k.transpose(-2, -1), q.dtype)
    return scores if visible is None else scores.masked_fill(~visible, float("-inf"))


def _weights(scores: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """softmax weights of a block against a log-sum-exp; 0 where nothing is visible."""
    return torch.exp(scores - torch.where(torch.isinf(lse), 0.0, lse))


def _heads(t: torch.Tensor, groups: int) -> torch.Tensor:
    """Grouped-query attention: each key or value head for the query heads it serves."""
    return t.repeat_interleave(groups, dim=1) if groups > 1 else t


def _fold(t: torch.Tensor, groups: int) -> torch.Tensor:
    """A gradient per query head summed into its key or value head."""
    return t.unflatten(1, (-1, groups)).sum(2) if groups > 1 else t


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn: RingAttention,
        dropout_p: float,
    ) -> torch.Tensor:  # fmt: skip
        ring, dtype, groups = attn.ring, q.dtype, q.shape[1] // k.shape[1]
        out = torch.zeros_like(q, dtype=torch.float32)
        lse = torch.full((*q.shape[:-1], 1), float("-inf"), device=q.device)
        kv, masks = (k, v), []
        for j in range(ring.size):
            pending = ring.start(kv, KV) if j < ring.size - 1 else None
            r, c, visible = attn.boxes[j]
            keys, values = (_heads(t[..., c, :], groups) for t in kv)
            scores = _scores(q[..., r, :], keys, visible)
            # per query; -inf where it sees none of the block's keys
            block_lse = torch.logsumexp(scores, dim=-1, keepdim=True)
            weights = _weights(scores, block_lse)
            if dropout_p > 0:
                masks.append(torch.rand_like(weights) >= dropout_p)
                weights = weights * masks[-1] / (1 - dropout_p)
            merged = torch.logaddexp(lse[..., r, :], block_lse)
            out[..., r, :] = out[..., r, :] * torch.exp(lse[..., r, :] - merged) + _mm(
                weights, values, dtype
            ) * torch.exp(block_lse - merged)
            lse[..., r, :] = merged  # finite from the first step on: a query always sees itself
            if pending is not None:
                kv = ring.finish(pending)
        ctx.save_for_backward(q, k, v, out, lse, *masks)
        ctx.attn, ctx.dropout_p = attn, dropout_p
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        q, k, v, out, lse, *masks = ctx.saved_tensors
        attn, p = ctx.attn, ctx.dropout_p
        ring, dtype, dout = attn.ring, q.dtype, dout.float()
        groups, scale = q.shape[1] // k.shape[1], 1 / math.sqrt(q.shape[-1])
        total = (dout * out).sum(dim=-1, keepdim=True)  # rowsum(dO * O) = rowsum(P * dP)
        dq = torch.zeros_like(q, dtype=torch.float32)
        kv, grads, sending = (k, v), None, None
        for j in range(ring.size):
            pending = ring.start(kv, KV) if j < ring.size - 1 else None
            r, c, visible = attn.boxes[j]
            keys, values = (_heads(t[..., c, :], groups) for t in kv)
            weights = _weights(_scores(q[..., r, :], keys, visible), lse[..., r, :])
            dropped = weights * masks[j] / (1 - p) if masks else weights
            dv, dk = (torch.zeros_like(t, dtype=torch.float32) for t in kv)
            dv[..., c, :] = _fold(_mm(dropped.transpose(-2, -1), dout[..., r, :], dtype), groups)
            dweights = _mm(dout[..., r, :], values.transpose(-2, -1), dtype)
            if masks:
                dweights = dweights * masks[j] / (1 - p)
            dscores = weights * (dweights - total[..., r, :]) * scale
            dq[..., r, :] += _mm(dscores, keys, dtype)
            dk[..., c, :] = _fold(_mm(dscores.transpose(-2, -1), q[..., r, :], dtype), groups)
            # The block's owner's key and value gradients travel with its keys and values: add
            # this rank's share to what the ranks before it summed, and pass them on.
            if sending is not None:
                grads = ring.finish(sending)
                dk, dv = dk + grads[0], dv + grads[1]
            sending = ring.start((dk, dv), GRADS)
            if pending is not None:
                kv = ring.finish(pending)
        dk, dv = ring.finish(sending)  # home: every rank's share of this rank's keys and values
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None
