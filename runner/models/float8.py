"""float8 training (trainer.precision=fp8): the model's linear layers as torchao's Float8Linear,
whose products run in float8 (torch._scaled_mm) with the scaling of trainer.fp8_recipe
(tensorwise: one scale a tensor; rowwise: one a row), over the 16-bit weights and fp32 masters of
bf16-true (FSDP2 gathers their bf16 weights; each layer casts them to float8 itself). What
torchtitan's float8 converter does. The decoder's output layer multiplies by the tied embedding
(no Linear) and stays bf16, as torchtitan leaves its output layer; torch._scaled_mm takes
dimensions that divide by 16, so a layer of other sizes stays bf16 too (FLOAT8_DIVISOR)."""

from __future__ import annotations

from torch import nn

FLOAT8_DIVISOR = 16


def takes_float8(module: nn.Module, fqn: str) -> bool:
    if not isinstance(module, nn.Linear):
        return False
    return module.in_features % FLOAT8_DIVISOR == 0 and module.out_features % FLOAT8_DIVISOR == 0


def to_float8(model: nn.Module, recipe: str) -> None:
    """`model`'s linear layers as float8 ones, in place."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig.from_recipe_name(recipe)
    convert_to_float8_training(model, config=config, module_filter_fn=takes_float8)
