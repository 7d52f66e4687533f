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
# Lightning's names; runner/precision.py says what each means for memory, traffic and FLOP/s.
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed")
# trainer.recompute: what each layer keeps for backward (runner/models/recompute.py)
RECOMPUTE = ("none", "full", "selective")
# parallel.shard: what data-parallel replicas split among themselves (runner/layouts/sharded/)
SHARDS = ("none", "optimizer", "gradients", "full")
EXAMPLES = ("neuron", "backprop")
ACCELERATORS = ("cpu", "gpu")
TIERS = ("auto", "intra_node", "inter_node")
BACKENDS = ("auto", "nccl", "gloo")  # torch.distributed's, for dist.backend
