"""Emulated device time (runner/models/device_time.py): a Linear's forward sleeps its time, its
backward twice that, and the values and gradients are the layer's own."""

import torch
from torch import nn

from runner.models import device_time


def test_each_linear_sleeps_its_time_in_forward_and_twice_in_backward(monkeypatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(device_time.time, "sleep", slept.append)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    plain = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    plain.load_state_dict(model.state_dict())
    assert device_time.emulate_device_time(model, 20) == 2
    x = torch.randn(5, 3)
    out = model(x)
    assert slept == [0.02, 0.02]
    out.sum().backward()
    assert slept == [0.02, 0.02, 0.04, 0.04]
    plain(x).sum().backward()
    assert torch.equal(out, plain(x))
    for a, b in zip(model.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)


def test_no_time_leaves_the_model_as_it_is() -> None:
    model = nn.Linear(3, 4)
    assert device_time.emulate_device_time(model, None) == 0
    assert not model._forward_hooks
