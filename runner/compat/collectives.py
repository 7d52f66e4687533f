"""torch's functional collectives, through which DTensor sums partial results and gathers shards,
called by module attribute (`funcol.all_reduce(...)`): the tensor-parallel probe wraps them to time
and count every one. `torch.distributed._functional_collectives` is private. Checked on torch 2.13.
"""

from __future__ import annotations

from collections.abc import Callable

from runner.compat import private

CHECKED = "2.13"
WHERE = "torch.distributed._functional_collectives"


def wrap_functional(wrappers: dict[str, Callable[[Callable], Callable]]) -> None:
    """Replace each named collective by wrapper(original)."""
    import torch.distributed._functional_collectives as funcol

    for name, wrap in wrappers.items():
        setattr(funcol, name, wrap(private(funcol, name, WHERE, "torch", CHECKED)))


def async_tensor_type() -> type:
    import torch.distributed._functional_collectives as funcol

    return private(funcol, "AsyncCollectiveTensor", WHERE, "torch", CHECKED)
