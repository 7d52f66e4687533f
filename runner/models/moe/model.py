"""A decoder-only transformer whose feed-forward blocks are mixtures of experts (Shazeer et al.
2017; GShard, Switch Transformer; Mixtral's top-2 of 8): the decoder of runner/models/decoder/,
each block's FFN replaced by n_experts FFNs of the same shape and a router that sends each token
to its top_k of them, their outputs weighted by the router's probabilities (renormalized over the
k chosen).

Routing is dropless by default (capacity_factor null: Megatron-Core's and torchtitan's default,
as Mixtral and DeepSeek-V3 trained): every expert takes every token routed to it. The routed
copies (tokens x top_k of them) are sorted by expert, and each expert runs over its own rows, as
many as the router sent it: nothing is padded, and expert parallelism moves them with
variable-size all-to-alls (Megatron-Core's and torchtitan's token dispatch). With a
capacity_factor each expert has capacity = ceil(capacity_factor x tokens x top_k / n_experts)
slots (Switch's): every token's first choice is placed before any token's second (GShard's order),
a token routed to a full expert is dropped there, and empty slots are zeros, so every expert's
rows have one fixed shape (GShard's and Switch's dense dispatch). The load-balancing loss
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

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """x: rows grouped by expert, counts[e] of them expert e's; each group through its own
        FFN. A module's forward, so that FSDP2 gathers the weights around it."""
        out = []
        for e, rows in enumerate(x.split(counts)):
            hidden = F.relu(torch.addmm(self.up_bias[e], rows, self.up[e]))
            out.append(torch.addmm(self.down_bias[e], hidden, self.down[e]))
        return torch.cat(out)


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
        # Runs the experts on the dispatched rows where they are not all here: expert
        # parallelism puts its all-to-all here (runner/layouts/expert/exchange.py)
        self.exchange: Callable[[torch.Tensor, list[int]], torch.Tensor] | None = None
        self.index = 0  # the block's number in the model (its router figures are logged by it)
        # What the router did since it was last read (runner/training/callbacks/router.py): over
        # a step's micro-batches, summed
        self.routed: dict[str, torch.Tensor] = {}

    def capacity(self, tokens: int) -> int:
        """Slots per expert under Switch's capacity: capacity_factor x an even share."""
        return math.ceil(self.capacity_factor * tokens * self.top_k / self.n_experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape, d, n = x.shape, x.shape[-1], self.n_experts
        tokens = x.reshape(-1, d)
        probs = F.softmax(self.router(tokens).float(), dim=-1)
        gate, choice = probs.topk(self.top_k, dim=-1)  # (tokens, k)
        gate = gate / gate.sum(dim=-1, keepdim=True)
        # Routed copies in choice-major order: every token's first choice before any second one
        chosen = choice.t().reshape(-1)
        load = torch.bincount(chosen, minlength=n)
        row, kept, counts = self.place(chosen, load, len(tokens))
        source = torch.arange(len(tokens), device=x.device).repeat(self.top_k)[kept]
        rows = tokens.new_zeros(sum(counts), d).index_put((row,), tokens[source])
        out = self.exchange(rows, counts) if self.exchange else self.experts(rows, counts)
        weighted = out[row] * gate.t().reshape(-1)[kept, None].to(out.dtype)
        y = tokens.new_zeros(len(tokens), d, dtype=out.dtype).index_add(0, source, weighted)
        balance = self.balance(choice, probs, shape[0])
        self.record(load, (~kept).sum(), balance)
        y = y.view(shape)
        if self.training and self.balance_weight > 0 and torch.is_grad_enabled():
            y = BalanceLoss.apply(y, balance * self.balance_weight)
        return self.dropout(y)

    def place(
        self, chosen: torch.Tensor, load: torch.Tensor, tokens: int
    ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Each routed copy's row among the experts' grouped rows, which copies are kept, and
        each expert's rows. Dropless: the copies sorted by expert, load[e] rows expert e's.
        Capacity: expert e's slots are rows e x capacity on, a copy's place its position among
        the copies routed there; those past the capacity are dropped."""
        if self.capacity_factor is None:
            row = torch.empty_like(chosen)
            row[chosen.argsort(stable=True)] = torch.arange(len(chosen), device=chosen.device)
            return row, torch.ones_like(chosen, dtype=torch.bool), load.tolist()
        capacity = self.capacity(tokens)
        position = (F.one_hot(chosen, self.n_experts).cumsum(0) - 1).gather(1, chosen[:, None])
        kept = position.squeeze(1) < capacity
        return (chosen * capacity + position.squeeze(1))[kept], kept, [capacity] * self.n_experts

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
