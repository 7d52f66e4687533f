"""mode=example: the seed's worked examples, computed by the real modules with autograd (not
typed-in formulas).

Each takes the model built from the config and the example's inputs and initial weights, and
returns the figures the seed prints, under the metric names the experiments log.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from runner.job import Job
from runner.losses import half_mse
from runner.metrics import (
    EXAMPLE_DLOSS_DYHAT,
    EXAMPLE_ERROR_TERM_A,
    EXAMPLE_ERROR_TERM_B,
    EXAMPLE_GRAD_W_A1,
    EXAMPLE_GRAD_W_B1,
    EXAMPLE_LOSS,
    EXAMPLE_LOSS_AFTER,
    EXAMPLE_W_A1_NEW,
    EXAMPLE_W_B1_NEW,
    EXAMPLE_Y_HAT,
    EXAMPLE_Y_HAT_AFTER,
    EXAMPLE_Y_HAT_RELU,
    EXAMPLE_Y_HAT_SHIFTED,
    EXAMPLE_Z,
    EXAMPLE_Z_SHIFTED,
)


def load_weights(model: nn.Module, weights: Sequence[dict[str, Any]]) -> None:
    """Copy {weight, bias} pairs into the model's Linear layers, in order."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if len(linears) != len(weights):
        raise ValueError(
            f"example.weights has {len(weights)} entries, the model {len(linears)} layers"
        )
    with torch.no_grad():
        for layer, values in zip(linears, weights, strict=True):
            layer.weight.copy_(torch.tensor(values["weight"]))
            layer.bias.copy_(torch.tensor(values["bias"]))


def neuron(model: nn.Module, ex: Any) -> dict[str, float]:
    """Chapter 1: z and sigmoid(z); the bias weight moved; the same z through ReLU."""
    load_weights(model, ex.weights)
    x = torch.tensor([list(ex.inputs)])
    with torch.no_grad():
        figures = {
            EXAMPLE_Z.name: model.weighted_sum(x).item(),
            EXAMPLE_Y_HAT.name: model(x).item(),
        }
        relu = type(model)(len(ex.inputs), "relu")  # the same neuron, through ReLU
        load_weights(relu, ex.weights)
        figures[EXAMPLE_Y_HAT_RELU.name] = relu(x).item()
        model.linear.bias.fill_(ex.shifted_bias)
        figures |= {
            EXAMPLE_Z_SHIFTED.name: model.weighted_sum(x).item(),
            EXAMPLE_Y_HAT_SHIFTED.name: model(x).item(),
        }
    return figures


@contextlib.contextmanager
def outputs_with_grads(layers: Sequence[nn.Module]) -> Iterator[list[torch.Tensor]]:
    """Record each layer's output during the forward pass and keep its gradient: dE/dz."""
    outputs: list[torch.Tensor] = []

    def hook(_: nn.Module, __: object, out: torch.Tensor) -> None:
        out.retain_grad()
        outputs.append(out)

    handles = [layer.register_forward_hook(hook) for layer in layers]
    try:
        yield outputs
    finally:
        for handle in handles:
            handle.remove()


def backprop(model: nn.Module, ex: Any) -> dict[str, float]:
    """Chapter 2: forward, error, backward, one gradient-descent step, forward again."""
    load_weights(model, ex.weights)
    layer_a, layer_b = (m for m in model.modules() if isinstance(m, nn.Linear))
    x, y = torch.tensor([list(ex.inputs)]), torch.tensor([[ex.target]])
    with outputs_with_grads([layer_a, layer_b]) as zs:
        y_hat = model(x)
    y_hat.retain_grad()
    loss = half_mse(y_hat, y)
    loss.backward()
    z_a, z_b = zs
    figures = {
        EXAMPLE_Y_HAT.name: y_hat.item(),
        EXAMPLE_LOSS.name: loss.item(),
        EXAMPLE_DLOSS_DYHAT.name: y_hat.grad.item(),
        EXAMPLE_ERROR_TERM_B.name: z_b.grad.item(),
        EXAMPLE_ERROR_TERM_A.name: z_a.grad.item(),
        EXAMPLE_GRAD_W_A1.name: layer_a.weight.grad[0, 0].item(),
        EXAMPLE_GRAD_W_B1.name: layer_b.weight.grad[0, 0].item(),
    }
    torch.optim.SGD(model.parameters(), lr=ex.lr).step()  # every weight, biases included
    figures |= {
        EXAMPLE_W_A1_NEW.name: layer_a.weight[0, 0].item(),
        EXAMPLE_W_B1_NEW.name: layer_b.weight[0, 0].item(),
    }
    with torch.no_grad():
        y_after = model(x)
    figures |= {
        EXAMPLE_Y_HAT_AFTER.name: y_after.item(),
        EXAMPLE_LOSS_AFTER.name: half_mse(y_after, y).item(),
    }
    return figures


EXAMPLES: dict[str, Callable[[nn.Module, Any], dict[str, float]]] = {
    "neuron": neuron,
    "backprop": backprop,
}


def run(
    cfg: DictConfig, job: Job | None, choices: Mapping[str, str | None], overrides: list[str]
) -> dict[str, float]:
    from hydra.utils import instantiate

    from runner.tracking.job_run import recorded_run

    with recorded_run(cfg, choices, overrides) as record:
        figures = EXAMPLES[cfg.example.name](instantiate(cfg.model, _convert_="all"), cfg.example)
        record.log_metrics(figures)
    return figures
