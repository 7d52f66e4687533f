"""AdamW takes torch's fused kernel where every parameter is on a GPU, and only there."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from runner.optimizers import options
from runner.training.module import TrainModule

GPU, CPU = SimpleNamespace(is_cuda=True), SimpleNamespace(is_cuda=False)


def test_adamw_on_gpu_parameters_is_fused() -> None:
    assert options("adamw", [GPU, GPU]) == {"fused": True}


@pytest.mark.parametrize(
    "name, params",
    [
        ("adamw", [CPU, CPU]),
        ("adamw", [GPU, CPU]),  # fused refuses a mixed list
        ("adamw", []),
        ("sgd", [GPU, GPU]),
    ],
)
def test_anything_else_keeps_torchs_default(name: str, params: list) -> None:
    assert options(name, params) == {}


def test_dtensor_parameters_keep_torchs_default(monkeypatch: pytest.MonkeyPatch) -> None:
    class FakeDTensor(SimpleNamespace):
        pass

    monkeypatch.setattr("runner.optimizers.DTensor", FakeDTensor)
    assert options("adamw", [GPU, FakeDTensor(is_cuda=True)]) == {}


def test_the_modules_adamw_on_cpu_is_not_fused() -> None:
    module = TrainModule(nn.Linear(3, 2), "cross_entropy", "adamw", lr=1e-3, weight_decay=0.01)
    optimizer = module.configure_optimizers()
    assert isinstance(optimizer, torch.optim.AdamW)
    assert not optimizer.param_groups[0]["fused"]
    assert len(optimizer.param_groups[0]["params"]) == 2
