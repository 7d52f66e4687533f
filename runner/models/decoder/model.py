"""A decoder-only transformer as the seed draws it (chapter on GPT), in nanoGPT's plain style.

Token embedding + fixed sinusoidal positions -> n_layers x [causal multi-head self-attention,
Add & Normalize, FFN (4x, ReLU), Add & Normalize] -> logits through the tied embedding matrix.
The softmax is left to the loss (cross-entropy), which applies it. Two later models' shapes, both
off by default: grouped-query attention (n_kv_heads < n_heads: each key and value head serves
n_heads / n_kv_heads query heads, Ainslie et al. 2023) and an FFN of another width (ffn_hidden).
"""

import math

import torch
import torch.nn.functional as F
from torch import nn


def sinusoidal_positions(context_len: int, d_model: int) -> torch.Tensor:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(...): fixed, never trained."""
    pos = torch.arange(context_len, dtype=torch.float32).unsqueeze(1)
    freq = torch.exp(
        -math.log(10000.0) * torch.arange(0, d_model, 2, dtype=torch.float32) / d_model
    )
    pe = torch.zeros(context_len, d_model)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq)
    return pe


class CausalSelfAttention(nn.Module):
    def __init__(
        self, d_model: int, n_heads: int, dropout: float = 0.0, n_kv_heads: int | None = None
    ) -> None:
        super().__init__()
        self.head_dim = d_model // n_heads
        kv = self.head_dim * (n_kv_heads or n_heads)
        # Separate Q, K, V and output projections: tensor parallelism splits each its own way.
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, kv)
        self.v_proj = nn.Linear(d_model, kv)
        self.o_proj = nn.Linear(d_model, d_model)
        self.grouped = kv != d_model
        self.dropout = dropout
        # Causal attention of Q to K and V; context parallelism puts its ring attention here
        # (runner/layouts/context/ring.py), each rank holding some of the sequence's positions.
        self.attend = F.scaled_dot_product_attention

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 heads: under tensor parallelism a rank holds only its share of the heads.
        q, k, v = (
            proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
            for proj in (self.q_proj, self.k_proj, self.v_proj)
        )
        p = self.dropout if self.training else 0.0
        grouped = {"enable_gqa": True} if self.grouped else {}
        y = self.attend(q, k, v, is_causal=True, dropout_p=p, **grouped)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, d_model: int, dropout: float = 0.0, hidden: int | None = None) -> None:
        super().__init__()
        hidden = hidden or 4 * d_model
        self.up = nn.Linear(d_model, hidden)
        self.down = nn.Linear(hidden, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.down(F.relu(self.up(x))))


class Block(nn.Module):
    """Post-norm, as the seed's "Add & Normalize" after each sub-layer."""

    def __init__(
        self, d_model: int, n_heads: int, dropout: float = 0.0, n_kv_heads: int | None = None,
        ffn_hidden: int | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        self.attn = CausalSelfAttention(d_model, n_heads, dropout, n_kv_heads)
        self.norm1 = nn.LayerNorm(d_model)
        self.ffn = FeedForward(d_model, dropout, ffn_hidden)
        self.norm2 = nn.LayerNorm(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.attn(x))
        return self.norm2(x + self.ffn(x))


class TiedOutput(nn.Module):
    """The output layer: logits through the embedding matrix, handed in at each call. It holds no
    weight of its own, so the tie stays one parameter; a module of its own so that tensor
    parallelism can prepare its inputs (runner/models/decoder/parallelize.py)."""

    def forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x @ weight.T


class Decoder(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        context_len: int,
        d_model: int,
        n_heads: int,
        n_layers: int,
        dropout: float = 0.0,
        n_kv_heads: int | None = None,
        ffn_hidden: int | None = None,
    ) -> None:
        super().__init__()
        self.d_model = d_model
        self.embed = nn.Embedding(vocab_size, d_model)
        self.register_buffer("pos", sinusoidal_positions(context_len, d_model), persistent=False)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            Block(d_model, n_heads, dropout, n_kv_heads, ffn_hidden) for _ in range(n_layers)
        )
        self.head = TiedOutput()
        # Tied output layer: with std d^-1/2, logits start near unit scale (Vaswani et al.).
        nn.init.normal_(self.embed.weight, std=d_model**-0.5)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        x = self.embed(tokens) * math.sqrt(self.d_model) + self.pos[:t]
        x = self.dropout(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x, self.embed.weight)  # logits, (batch, time, vocab)
