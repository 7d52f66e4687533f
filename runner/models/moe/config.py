from dataclasses import dataclass

from runner.models.decoder.config import DecoderConfig


@dataclass
class MoEConfig(DecoderConfig):
    _target_: str = "runner.models.moe.model.MoEDecoder"
    n_experts: int = 4  # feed-forward networks per block, of which each token takes top_k
    top_k: int = 2
    # null: dropless (every expert takes every token routed to it; Megatron-Core's and
    # torchtitan's default). A number: slots per expert as a multiple of an even share (tokens x
    # top_k / n_experts), Switch's capacity: a token routed to a full expert is dropped there (its
    # other choices and the residual carry it); n_experts / top_k (or more) drops none.
    capacity_factor: float | None = None
    balance_weight: float = 0.01  # the load-balancing loss's weight (Switch Transformer's alpha)
