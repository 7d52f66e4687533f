"""A decoder-only transformer whose feed-forward blocks are mixtures of experts (Shazeer et al.
2017; GShard, Switch Transformer; Mixtral's top-2 of 8): the decoder of runner/models/decoder/,
each block's FFN replaced by n_experts FFNs of the same shape and a router that sends each token
to its top_k of them, their outputs weighted by the router's probabilities (renormalized over the
k chosen).

Routing is dropless by default (capacity_factor null: Megatron-Core's and torchtitan's default,
as Mixtral and DeepSeek-V3 trained): every expert takes every token routed to it, and each has as
many slots as the busiest one's load (over the expert-parallel ranks, which agree on it). With a
capacity_factor each expert has capacity = ceil(capacity_factor x tokens x top_k / n_experts)
slots (Switch's): every token's first choice is placed before any token's second (GShard's order),
and a token routed to a full expert is dropped there. The slots make the dispatch a dense (experts
x capacity x d_model) buffer: expert parallelism moves it with all-to-all. The load-balancing loss
(Switch Transformer's, n_experts x sum over experts of the share of tokens routed to it times its
mean router probability, taken per sequence and averaged, as DeepSeek-V3's sequence-wise loss and
Megatron-LM's seq_aux_loss take it: so it does not depend on how a batch is split over ranks and
micro-batches) is not added to the loss: its gradient, times balance_weight, joins backward at the
block's output (Megatron-LM's way), so train_loss stays the language model's.
"""

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from runner.models.decoder.model import Decoder


class Experts(nn.Module):
    """n FFNs (d -> 4d, ReLU, -> d) as stacked weights, each initialized as nn.Linear is."""

    def __init__(self, n: int, d_model: int) -> None:
        super().__init__()
        hidden = 4 * d_model

        def uniform(*shape: int, fan_in: int) -> nn.Parameter:
            bound = 1 / math.sqrt(fan_in)
            return nn.Parameter(torch.empty(*shape).uniform_(-bound, bound))

        self.up = uniform(n, d_model, hidden, fan_in=d_model)
        self.up_bias = uniform(n, hidden, fan_in=d_model)
        self.down = uniform(n, hidden, d_model, fan_in=hidden)
        self.down_bias = uniform(n, d_model, fan_in=hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (experts, slots, d_model), each expert's slots through its own FFN."""
        h = F.relu(torch.baddbmm(self.up_bias[:, None, :], x, self.up))
        return torch.baddbmm(self.down_bias[:, None, :], h, self.down)


class BalanceLoss(torch.autograd.Function):
    """Identity on the block's output; in backward, the balancing loss's gradient joins."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.dtype = loss.dtype
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        return grad, torch.ones((), dtype=ctx.dtype, device=grad.device)


class MoEFeedForward(nn.Module):
    def __init__(
        self, d_model: int, n_experts: int, top_k: int, capacity_factor: float | None,
        balance_weight: float, dropout: float = 0.0,
    ) -> None:  # fmt: skip
        super().__init__()
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.experts = Experts(n_experts, d_model)
        self.n_experts, self.top_k = n_experts, top_k
        self.capacity_factor, self.balance_weight = capacity_factor, balance_weight
        self.dropout = nn.Dropout(dropout)
        # Runs the experts on the dispatched slots where they are not all here: expert
        # parallelism puts its all-to-all here (runner/layouts/expert/exchange.py)
        self.exchange: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.index = 0  # the block's number in the model (its router figures are logged by it)
        # What the router did since it was last read (runner/training/callbacks/router.py): over
        # a step's micro-batches, summed
        self.routed: dict[str, torch.Tensor] = {}

    def capacity(self, tokens: int, load: torch.Tensor | None = None) -> int:
        """Slots per expert: capacity_factor x an even share; dropless (no factor), the busiest
        expert's `load` (tokens routed to each), agreed over the expert-parallel ranks."""
        if self.capacity_factor is not None:
            return math.ceil(self.capacity_factor * tokens * self.top_k / self.n_experts)
        busiest = int(load.max()) if load is not None else tokens
        agree = getattr(self.exchange, "agree", None)
        return agree(busiest) if agree is not None else busiest

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape, d, n = x.shape, x.shape[-1], self.n_experts
        tokens = x.reshape(-1, d)
        probs = F.softmax(self.router(tokens).float(), dim=-1)
        gate, choice = probs.topk(self.top_k, dim=-1)  # (tokens, k)
        gate = gate / gate.sum(dim=-1, keepdim=True)
        # Slots in choice-major order: every token's first choice before any second choice
        chosen = choice.t().reshape(-1)
        per_expert = F.one_hot(chosen, n)
        position = (per_expert.cumsum(0) - 1).gather(1, chosen[:, None]).squeeze(1)
        capacity = self.capacity(len(tokens), per_expert.sum(0))
        kept = position < capacity
        slot = (chosen * capacity + position)[kept]
        source = torch.arange(len(tokens), device=x.device).repeat(self.top_k)[kept]
        slots = tokens.new_zeros(n * capacity, d).index_put((slot,), tokens[source])
        out = (self.exchange or self.experts)(slots.view(n, capacity, d)).reshape(n * capacity, d)
        weighted = out[slot] * gate.t().reshape(-1)[kept, None].to(out.dtype)
        y = tokens.new_zeros(len(tokens), d, dtype=out.dtype).index_add(0, source, weighted)
        balance = self.balance(choice, probs, shape[0])
        self.record(per_expert.sum(0), (~kept).sum(), balance)
        y = y.view(shape)
        if self.training and self.balance_weight > 0 and torch.is_grad_enabled():
            y = BalanceLoss.apply(y, balance * self.balance_weight)
        return self.dropout(y)

    def balance(self, choice: torch.Tensor, probs: torch.Tensor, sequences: int) -> torch.Tensor:
        """Per sequence, n x the sum over experts of the share of its tokens' choices routed to
        each times its mean router probability there; the mean over sequences. Whole sequences
        make it the same however a batch is split into ranks and micro-batches."""
        n = self.n_experts
        routed = F.one_hot(choice.view(sequences, -1), n).float().mean(1)  # (sequences, n)
        return n * (routed * probs.view(sequences, -1, n).mean(1)).sum(-1).mean()

    def record(self, counts: torch.Tensor, dropped: torch.Tensor, balance: torch.Tensor) -> None:
        figures = {"counts": counts.float(), "dropped": dropped.float(), "balance": balance,
                   "forwards": torch.ones((), device=counts.device)}  # fmt: skip
        for key, value in figures.items():
            self.routed[key] = self.routed.get(key, 0) + value.detach()


class MoEDecoder(Decoder):
    def __init__(
        self, vocab_size: int, context_len: int, d_model: int, n_heads: int, n_layers: int,
        dropout: float = 0.0, n_experts: int = 4, top_k: int = 2,
        capacity_factor: float | None = None,
        balance_weight: float = 0.01, n_kv_heads: int | None = None, ffn_hidden: int | None = None,
    ) -> None:  # fmt: skip
        # ffn_hidden: the experts' width is 4 x d_model (MoESpec.check refuses another)
        super().__init__(vocab_size, context_len, d_model, n_heads, n_layers, dropout, n_kv_heads)
        for i, block in enumerate(self.blocks):
            block.ffn = MoEFeedForward(
                d_model, n_experts, top_k, capacity_factor, balance_weight, dropout
            )
            block.ffn.index = i
