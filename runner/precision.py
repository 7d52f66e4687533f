"""What a run's precision means for the planner and the rules (torch-free).

`trainer.precision` takes Lightning's names where Lightning has one:

- `32-true`: everything fp32.
- `bf16-mixed`, `16-mixed`: Lightning's autocast. Matmuls run in 16 bits while weights, gradients
  and the optimizer's state stay fp32, and autocast holds a 16-bit copy of each weight it casts
  from forward until backward has used it. Norms' outputs and the residual stream stay fp32 (the
  model's spec says which tensors: `fp32_stream`); gradients are reduced in fp32.
- `bf16-true`: 16-bit weights over fp32 masters, as large runs train (Megatron-LM's `--bf16` with
  its distributed optimizer; torchtitan's FSDP2 `MixedPrecisionPolicy(param_dtype=bfloat16,
  reduce_dtype=float32)`; Lightning's `bf16-true` under its FSDP strategy, which keeps fp32
  shards). Layers hold and compute with bf16 weights, so every activation, the residual stream
  included, is 16-bit; the optimizer steps fp32 master weights, sharded wherever its state is.
  Gradients are accumulated and reduced in `trainer.grad_reduce` (fp32 by default).
- `fp8`: `bf16-true` with the blocks' linear layers' products in float8 (torchao's float8
  training, `trainer.fp8_recipe` its scaling: tensorwise or rowwise). Attention's products and the
  output layer stay bf16, as torchtitan's float8 converter leaves them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

PARAM_BYTES = 4  # an fp32 weight, gradient or master weight


@dataclass(frozen=True)
class Precision:
    name: str  # Lightning's where it has one: one of runner.choices.PRECISIONS
    compute: str  # the key of hardware.peak_tflops its matmuls run at
    activation_bytes: int  # bytes per activation element (what stages send, what layers keep)
    weight_copy_bytes: int  # autocast's 16-bit copy of each weight, held through backward
    stream_bytes: int = (
        PARAM_BYTES  # the residual stream's and norms' outputs (fp32 under autocast)
    )
    weight_bytes: int = PARAM_BYTES  # the weights layers hold and compute with
    master_bytes: int = 0  # fp32 master weights beside 16-bit ones (0: the weights are their own)
    grad_bytes: int = PARAM_BYTES  # gradients as they are accumulated and reduced
    linear_compute: str = ""  # the blocks' linear layers' peak key where it differs (fp8)

    @property
    def mixed(self) -> bool:
        return self.weight_copy_bytes > 0

    @property
    def masters(self) -> bool:
        """16-bit weights over fp32 master weights."""
        return self.master_bytes > 0

    @property
    def computes(self) -> tuple[str, ...]:
        """Every hardware.peak_tflops key its products run at."""
        return (self.compute, self.linear_compute) if self.linear_compute else (self.compute,)


TRUE_BF16 = Precision("bf16-true", "bf16", 2, 0, stream_bytes=2, weight_bytes=2, master_bytes=4)

BY_NAME = {  # keyed by runner.choices.PRECISIONS (a test checks)
    "32-true": Precision("32-true", "fp32", 4, 0),
    "bf16-mixed": Precision("bf16-mixed", "bf16", 2, 2),
    "16-mixed": Precision("16-mixed", "fp16", 2, 2),
    "bf16-true": TRUE_BF16,
    "fp8": replace(TRUE_BF16, name="fp8", linear_compute="fp8"),
}

REDUCE_BYTES = {"fp32": 4, "bf16": 2}  # trainer.grad_reduce: runner.choices.GRAD_REDUCE


def precision_of(trainer: object) -> Precision:
    """The trainer config's precision; fp32 matmuls on TF32 tensor cores with trainer.tf32;
    gradients reduced in 16 bits with trainer.grad_reduce=bf16 (16-bit weights only)."""
    found = BY_NAME[trainer.precision]
    if found.name == "32-true" and getattr(trainer, "tf32", False):
        return Precision("32-true", "tf32", 4, 0)
    if found.masters:
        return replace(found, grad_bytes=REDUCE_BYTES[getattr(trainer, "grad_reduce", "fp32")])
    return found
