"""torch's functional collectives, through which DTensor sums partial results and gathers shards,
called by module attribute (`funcol.all_reduce(...)`): the tensor-parallel probe wraps them to time
and count every one. `torch.distributed._functional_collectives` is private.

The gather and scatter were renamed in pytorch#186125 (all_gather_tensor -> all_gather_single,
reduce_scatter_tensor -> reduce_scatter_single): 2.13 has both, the old names as deprecated aliases
that call the new ones by module attribute; releases before the rename (2.11, on the GPU machines)
have only the *_tensor names. all_reduce has one name in both.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import version
from typing import Any

from runner.compat import MissingAPI, private

CHECKED = "2.13"
WHERE = "torch.distributed._functional_collectives"

Wrap = Callable[[Callable], Callable]


def wrap_functional(wrappers: dict[tuple[str, ...], Wrap]) -> None:
    """Replace each collective by wrapper(original), the collective named by the first of its
    candidate names (newest first) that the installed torch has."""
    import torch.distributed._functional_collectives as funcol

    wrap_first_present(funcol, wrappers)


def wrap_first_present(module: Any, wrappers: dict[tuple[str, ...], Wrap]) -> None:
    """On `module`, the first present of each candidate tuple replaced by wrapper(original). Only
    the first: an older name left in place is an alias that calls the newer one, and wrapping both
    would count every call twice."""
    # All looked up before any is replaced: a release missing one is left as it was.
    names = [_first_present(module, candidates) for candidates in wrappers]
    for name, wrap in zip(names, wrappers.values(), strict=True):
        setattr(module, name, wrap(getattr(module, name)))


def _first_present(module: Any, candidates: tuple[str, ...]) -> str:
    for name in candidates:
        if hasattr(module, name):
            return name
    tried = " or ".join(f"{WHERE}.{name}" for name in candidates)
    raise MissingAPI(
        f"{tried} is missing in torch {version('torch')}; "
        f"the runner patches it and was checked with torch {CHECKED}"
    )


def async_tensor_type() -> type:
    import torch.distributed._functional_collectives as funcol

    return private(funcol, "AsyncCollectiveTensor", WHERE, "torch", CHECKED)
