from dataclasses import dataclass, field

from omegaconf import MISSING


@dataclass
class FFNNConfig:
    _target_: str = "runner.models.ffnn.model.FFNN"
    in_features: int = MISSING
    hidden: list[int] = field(default_factory=lambda: [64, 32])
    out_features: int = MISSING
    activation: str = "relu"  # relu | sigmoid | tanh | none
    output_activation: str = "none"  # none | relu | sigmoid | tanh
