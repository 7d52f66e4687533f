"""The models are the seed's: checked against its numbers and against the size formulas."""

import math

import pytest
import torch
from torch import nn

from runner.models.decoder.model import Decoder, sinusoidal_positions
from runner.models.ffnn.model import FFNN
from runner.models.neuron.model import Neuron
from runner.models.registry import SPECS
from tests.helpers.jobs import compose_job

COMPONENTS = (
    ("embed", "embedding"),
    (".attn.", "attention"),
    ("norm", "norm"),
    ("router", "router"),
    ("experts", "experts"),
)


def built_sizes(model_cfg) -> dict[str, int]:
    """Parameters per component of the model built on the meta device: no memory is touched."""
    from hydra.utils import instantiate

    with torch.device("meta"):
        model = instantiate(model_cfg, _convert_="all")
    by_component: dict[str, int] = {}
    for name, p in model.named_parameters():
        part = next((part for key, part in COMPONENTS if key in name), "ffn")
        by_component[part] = by_component.get(part, 0) + p.numel()
    return by_component


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_neuron_is_a_weighted_sum_plus_bias_weight_through_the_activation() -> None:
    neuron = Neuron(2, "sigmoid")
    with torch.no_grad():
        neuron.linear.weight.copy_(torch.tensor([[2.0, -1.0]]))
        neuron.linear.bias.fill_(0.5)
    x = torch.tensor([[1.0, 3.0]])
    assert neuron(x).item() == pytest.approx(1 / (1 + math.exp(0.5)))  # z = 2 - 3 + 0.5


def test_ffnn_widths_and_activations() -> None:
    net = FFNN(4, [8, 6], 3, "tanh", "sigmoid")
    shapes = [tuple(m.weight.shape) for m in net.modules() if isinstance(m, nn.Linear)]
    assert shapes == [(8, 4), (6, 8), (3, 6)]
    assert isinstance(net.layers[-1], nn.Sigmoid)
    assert n_params(net) == SPECS["ffnn"].params(
        {"in_features": 4, "hidden": [8, 6], "out_features": 3}
    )


def test_positional_encoding_is_the_standard_sin_cos_pairing() -> None:
    # The seed prints [-0.8, +1.0] for position 4, d = 2 with its own index convention;
    # the standard pairing gives [sin 4, cos 4] (see docs/design.md).
    pe = sinusoidal_positions(8, 2)
    assert pe[4].tolist() == pytest.approx([-0.757, -0.654], abs=1e-3)


def small_decoder() -> Decoder:
    torch.manual_seed(0)
    return Decoder(vocab_size=50, context_len=16, d_model=32, n_heads=4, n_layers=2)


def test_decoder_is_causal() -> None:
    model = small_decoder().eval()
    tokens = torch.randint(2, 50, (1, 12))
    changed = tokens.clone()
    changed[0, 8] = (tokens[0, 8] + 1) % 50
    before, after = model(tokens), model(changed)
    assert before.shape == (1, 12, 50)
    assert torch.equal(before[0, :8], after[0, :8])  # the past never sees the future
    assert not torch.allclose(before[0, 8:], after[0, 8:])


def test_decoder_output_layer_is_the_tied_embedding() -> None:
    model = small_decoder().eval()
    hidden: list[torch.Tensor] = []
    model.blocks[-1].register_forward_hook(lambda _m, _i, out: hidden.append(out))
    logits = model(torch.randint(2, 50, (2, 10)))
    assert torch.allclose(logits, hidden[0] @ model.embed.weight.T)
    # No separate output matrix: the only (vocab, d_model) parameter is the embedding.
    assert sum(p.shape == (50, 32) for p in model.parameters()) == 1


def test_grouped_query_attention_is_multi_head_attention_with_shared_keys_and_values() -> None:
    """4 query heads on 2 key/value heads: the same logits as 4 heads whose K and V projections
    repeat each shared head for the 2 query heads it serves (heads 0, 1 on the first)."""
    torch.manual_seed(0)
    grouped = Decoder(50, 16, 32, 4, 2, n_kv_heads=2, ffn_hidden=48)
    full = Decoder(50, 16, 32, 4, 2, ffn_hidden=48)
    state = grouped.state_dict()
    for name, value in list(state.items()):
        if ".k_proj." in name or ".v_proj." in name:  # (2 heads x 8, ...) -> (4 heads x 8, ...)
            state[name] = value.unflatten(0, (2, 8)).repeat_interleave(2, dim=0).flatten(0, 1)
    full.load_state_dict(state)
    tokens = torch.randint(0, 50, (2, 16))
    assert torch.allclose(grouped(tokens), full(tokens), atol=1e-6)
    assert grouped.blocks[0].ffn.up.out_features == 48


@pytest.mark.parametrize("preset", ["decoder", "gpt3_175b", "llama3_405b", "moe", "mixtral_8x7b"])
def test_size_formulas_match_the_built_module(preset: str) -> None:
    cfg, _ = compose_job(f"model={preset}")
    # GPT-3 is only ever built here, on the meta device; every parameter falls in a component.
    spec = SPECS["moe" if preset in ("moe", "mixtral_8x7b") else "decoder"]
    assert built_sizes(cfg.model) == spec.params_by_component(cfg.model)


def test_gpt3_has_the_seeds_sizes() -> None:
    cfg, _ = compose_job("model=gpt3_175b")
    parts = SPECS["decoder"].params_by_component(cfg.model)
    assert parts["embedding"] == 614_400_000  # 50,000 x 12,288
    assert parts["attention"] / 96 == pytest.approx(604e6, rel=0.01)
    assert parts["ffn"] / 96 == pytest.approx(1208e6, rel=0.01)
    assert sum(parts.values()) == pytest.approx(175e9, rel=0.01)
