"""Expert parallelism's traffic: each mixture-of-experts block's rows (top_k copies of each token
dropless, every expert's slots under Switch's capacity: runner/models/moe/model.py) all-to-all to
the experts' ranks and back, per micro-batch: forward the dispatch carries the residual stream's
values (fp32 under autocast, 16 bits over 16-bit weights) and the combine the experts' outputs
(in what autocast computes in); backward their gradients, the other way, in the same dtypes.
Dropless, each forward first sends the experts' token counts (int64). Recomputation, full or
selective, runs the forward's again, in backward. nccl-tests' payload: what a rank sends, whose
mean over the ranks is the planned: a combine returns what the dispatch brought, which is more
than the even share on a rank with busier experts, less on the others. The experts' gradients,
summed over their replicas, are data parallelism's (runner/layouts/data/traffic.py)."""

from __future__ import annotations

from runner.job import Job
from runner.layouts.traffic import Traffic
from runner.precision import precision_of


def traffic(job: Job) -> Traffic:
    mesh = job.mesh
    if mesh.ep < 2:
        return Traffic()
    samples = job.batch_size // mesh.dp  # a replica's, over its micro-batches
    rows, calls, counts = job.spec.ep_traffic(
        job.model, job.data, samples, job.microbatches, mesh.cp
    )
    precision = precision_of(job.trainer)
    forward = precision.activation_bytes
    elem = (
        job.spec.between_layers_bytes(forward, precision.stream_bytes) + forward
    )  # a dispatch's and a combine's
    # forward, backward, and a forward again under recomputation: selective keeps DTensor's
    # sums, not the all-to-alls
    forwards = 1 + (job.trainer.recompute != "none")
    sent = ((forwards + 1) * rows * elem + forwards * counts) / mesh.pp
    exchanges = (2 * (forwards + 1) + forwards * (counts > 0)) * calls / mesh.pp
    return Traffic({"ep": sent}, {"ep": exchanges})
