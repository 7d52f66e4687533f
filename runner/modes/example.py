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
        figures = {"z": model.weighted_sum(x).item(), "y_hat": model(x).item()}
        relu = type(model)(len(ex.inputs), "relu")  # the same neuron, through ReLU
        load_weights(relu, ex.weights)
        figures["y_hat_relu"] = relu(x).item()
        model.linear.bias.fill_(ex.shifted_bias)
        figures |= {"z_shifted": model.weighted_sum(x).item(), "y_hat_shifted": model(x).item()}
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
        "y_hat": y_hat.item(),
        "loss": loss.item(),
        "dloss_dyhat": y_hat.grad.item(),
        "error_term_b": z_b.grad.item(),
        "error_term_a": z_a.grad.item(),
        "grad_w_a1": layer_a.weight.grad[0, 0].item(),
        "grad_w_b1": layer_b.weight.grad[0, 0].item(),
    }
    torch.optim.SGD(model.parameters(), lr=ex.lr).step()  # every weight, biases included
    figures |= {"w_a1_new": layer_a.weight[0, 0].item(), "w_b1_new": layer_b.weight[0, 0].item()}
    with torch.no_grad():
        y_after = model(x)
    figures |= {"y_hat_after": y_after.item(), "loss_after": half_mse(y_after, y).item()}
    return figures


EXAMPLES: dict[str, Callable[[nn.Module, Any], dict[str, float]]] = {
    "neuron": neuron,
    "backprop": backprop,
}


def run(
    cfg: DictConfig, job: Job | None, choices: Mapping[str, str | None], overrides: list[str]
) -> dict[str, float]:
    from hydra.utils import instantiate

    from runner.tracking import recorded_run

    with recorded_run(cfg, choices, overrides) as record:
        figures = EXAMPLES[cfg.example.name](instantiate(cfg.model, _convert_="all"), cfg.example)
        record.log_metrics(figures)
    return figures
