"""What a run's precision means for the planner and the rules (torch-free).

`trainer.precision` takes Lightning's names. Mixed precision here is Lightning's: torch's autocast
runs matmuls in 16 bits while weights, gradients and the optimizer's state stay fp32 (and autocast
holds a 16-bit copy of each weight it casts from forward until backward has used it). So the
data-parallel all-reduce carries fp32 gradients at every precision; activations, and what a
pipeline sends between stages, are 16-bit.
"""

from __future__ import annotations

from dataclasses import dataclass

PARAM_BYTES = 4  # weights and gradients stay fp32 at every precision (autocast casts per op)


@dataclass(frozen=True)
class Precision:
    name: str  # Lightning's: one of runner.choices.PRECISIONS
    compute: str  # the key of hardware.peak_tflops its matmuls run at
    activation_bytes: int  # bytes per activation element (what stages send, what layers keep)
    weight_copy_bytes: int  # autocast's 16-bit copy of each weight, held through backward

    @property
    def mixed(self) -> bool:
        return self.weight_copy_bytes > 0


BY_NAME = {  # keyed by runner.choices.PRECISIONS (a test checks)
    "32-true": Precision("32-true", "fp32", 4, 0),
    "bf16-mixed": Precision("bf16-mixed", "bf16", 2, 2),
    "16-mixed": Precision("16-mixed", "fp16", 2, 2),
}


def precision_of(trainer: object) -> Precision:
    """The trainer config's precision; fp32 matmuls on TF32 tensor cores with trainer.tf32."""
    found = BY_NAME[trainer.precision]
    if found.name == "32-true" and getattr(trainer, "tf32", False):
        return Precision("32-true", "tf32", 4, 0)
    return found
