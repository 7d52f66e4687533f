from dataclasses import dataclass

from omegaconf import MISSING


@dataclass
class NeuronConfig:
    _target_: str = "runner.models.neuron.model.Neuron"
    n_inputs: int = MISSING
    activation: str = "sigmoid"  # sigmoid | relu | tanh
