from dataclasses import dataclass

from omegaconf import MISSING


@dataclass
class DecoderConfig:
    _target_: str = "runner.models.decoder.model.Decoder"
    vocab_size: int = MISSING
    context_len: int = 64
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 2
    dropout: float = 0.0
    n_kv_heads: int | None = None  # grouped-query attention's key/value heads; None: n_heads
    ffn_hidden: int | None = None  # the FFN's width; None: 4 x d_model
