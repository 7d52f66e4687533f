"""One list of each choice a config can make, for the schema's comments, validation and the code.

Torch-free: validation reads these before anything heavy is imported. The code's tables are keyed
by these very names (runner/models/activations.py, runner/losses.py, runner/optimizers.py,
runner/layouts/pipeline/stages.py), and a test checks each table covers its list.
"""

ACTIVATIONS = ("relu", "sigmoid", "tanh", "none")
LOSSES = ("cross_entropy", "mse", "half_mse", "bce")
OPTIMIZERS = ("adamw", "sgd")
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zero_bubble")
MULTI_STAGE = ("interleaved_1f1b", "zero_bubble")  # schedules that drive several stages per rank
MODES = ("train", "example", "plan", "search", "calibrate", "report")
# Lightning's names where it has one; runner/precision.py says what each means for memory,
# traffic and FLOP/s.
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "fp8")
GRAD_REDUCE = ("fp32", "bf16")  # trainer.grad_reduce: what 16-bit weights' gradients sum in
FP8_RECIPES = ("tensorwise", "rowwise")  # trainer.fp8_recipe: torchao's float8 scalings
# trainer.recompute: what each layer keeps for backward (runner/models/recompute.py)
RECOMPUTE = ("none", "full", "selective")
# trainer.attention: the kernel torch's SDPA runs (runner/models/attention_kernel.py)
ATTENTION = ("auto", "math")
# parallel.shard: what data-parallel replicas split among themselves (runner/layouts/sharded/)
SHARDS = ("none", "optimizer", "gradients", "full")
# parallel.reshard_after_forward: whether ZeRO-3 frees a unit's gathered weights after its forward
# (torchtitan's fsdp_reshard_after_forward): default = always outside a pipeline, never in one
RESHARD = ("default", "always", "never")
# parallel.param_gather: when the distributed optimizer (ZeRO-1/2 on FSDP2) gathers the updated
# weights: overlapping the next forward, or right after the step (Megatron-LM's default)
PARAM_GATHER = ("forward", "step")
EXAMPLES = ("neuron", "backprop")
ACCELERATORS = ("cpu", "gpu")
TIERS = ("auto", "intra_node", "inter_node")
# hardware.figures: a CPU job priced with its profile's figures, or this host's own (measured once
# by mode=calibrate and kept: runner/planner/host_figures.py)
FIGURES = ("profile", "host")
BACKENDS = ("auto", "nccl", "gloo")  # torch.distributed's, for dist.backend
