"""Expert parallelism's traffic: each mixture-of-experts block's slots (n_experts x capacity x
d_model, runner/models/moe/model.py) all-to-all to the experts' ranks and back, per micro-batch:
forward the dispatch carries the residual stream's values (fp32 under autocast, 16 bits over
16-bit weights) and the combine the experts' outputs (in what autocast computes in); backward
their gradients, the other way, in the same dtypes. Recomputation, full or selective, runs the
forward's pair again, in backward. nccl-tests' payload: each all-to-all's input. The experts'
gradients, summed over their replicas, are data parallelism's (runner/layouts/data/traffic.py)."""

from __future__ import annotations

from runner.job import Job
from runner.layouts.traffic import Traffic
from runner.precision import precision_of


def traffic(job: Job) -> Traffic:
    mesh = job.mesh
    if mesh.ep < 2:
        return Traffic()
    samples = job.batch_size // mesh.dp  # a replica's, over its micro-batches
    slots, calls = job.spec.ep_traffic(job.model, job.data, samples, job.microbatches, mesh.cp)
    precision = precision_of(job.trainer)
    forward = precision.activation_bytes
    elem = (
        job.spec.between_layers_bytes(forward, precision.stream_bytes) + forward
    )  # a dispatch's and a combine's
    # forward, backward, and a forward again under recomputation: selective keeps DTensor's
    # sums, not the all-to-alls
    passes = 2 + (job.trainer.recompute != "none")
    return Traffic({"ep": passes * slots * elem / mesh.pp}, {"ep": 2 * passes * calls / mesh.pp})
