"""torch's DDP over DTensor shards (`_pre_dp_module_transform`, data parallelism over tensor-
parallel shards) keeps each shard as a plain local tensor with its DTensor spec in the private
attribute `_st_info`; after the first forward the module lists none of them. Snapshots need each
as a DTensor again (runner/snapshots.py). Checked on torch 2.13.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from runner.compat import MissingAPI, private

CHECKED = "2.13"
ATTRIBUTE = "_st_info"


def localized_shards(module: nn.Module, split: bool) -> list[tuple[str, nn.Parameter]]:
    """The parameters DDP turned into local tensors, by name; `split`: the module was split over
    a tensor-parallel mesh, so there must be some."""
    found = [(name, p) for name, p in module.named_parameters() if hasattr(p, ATTRIBUTE)]
    if split and not found:
        import torch

        raise MissingAPI(
            f"DDP over DTensor shards left no parameter with `{ATTRIBUTE}` in torch "
            f"{torch.__version__}; the runner's snapshots read it and were checked with {CHECKED}"
        )
    return found


def leave_to_others(module: nn.Module, names: list[str]) -> None:
    """Parameters (by name in `module`) that DDP, wrapping `module` next, leaves alone: expert
    parallelism sums the experts' gradients itself. DDP's private static method, checked on
    torch 2.13."""
    from torch.nn.parallel import DistributedDataParallel

    method = private(
        DistributedDataParallel, "_set_params_and_buffers_to_ignore_for_model",
        "torch.nn.parallel.DistributedDataParallel", "torch", CHECKED,
    )  # fmt: skip
    method(module, names)


def shard_spec(local: nn.Parameter) -> Any:
    """The DTensor spec (mesh, placements, shape, stride) of a localized shard."""
    return getattr(local, ATTRIBUTE)
