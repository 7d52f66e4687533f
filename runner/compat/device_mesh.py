"""A device mesh's dimensions flattened into one: the data-parallel replicas and, with context
parallelism, each replica's cp ranks, which together sum gradients (torchtitan's "dp_cp").
`DeviceMesh._flatten` is private (torch 2.4 on; 2.11 on the GPU machines has it too)."""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh

from runner.compat import private

CHECKED = "2.13"


def flattened(mesh: DeviceMesh, dims: tuple[str, ...]) -> DeviceMesh:
    """One dimension of `mesh` over `dims`' ranks; the dimension itself where it is one."""
    if len(dims) == 1:
        return mesh[dims[0]]
    sub = mesh[dims]
    return private(sub, "_flatten", "torch.distributed.device_mesh.DeviceMesh", "torch", CHECKED)(
        "_".join(dims)
    )
