"""Every metric the runner logs to MLflow, in one place: its name, unit, meaning and the module
that writes it. Writers and readers take names from here, never spell them: a renamed figure then
renames everywhere at once, where a misspelt string would silently drop it from the summary, the
comparison or the report. docs/measurement.md names every entry (tests/test_metrics.py), and the
tests check that real runs log only registered names.

A name with a part that varies is a pattern: `<dim>` a mesh dimension, `<r>` a rank, `<collective>`
a collective, and the others in PARTS. The style every module keeps:

- a fixed name: `STEP_TIME.name`; a pattern's concrete name: `COMM_BYTES_PER_STEP.at(dim="dp")`;
- a figure's other forms: `of_rank(IDLE_FRACTION, 3)` ("rank_3/idle_fraction"), `worst(...)`
  (the largest over ranks, "..._max") and `prediction(key)` (the planner's "pred/..." of a
  measured key);
- figures a mode keeps nested (`{"snapshots": {"snapshot_interval_s": ...}}`, logged flattened
  with `/`): `.group` is the outer key, `.leaf` the inner one.

Imports nothing: light modules (the planner, the summary) read it.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

# What each placeholder of a pattern stands for, as a regular expression.
PARTS = {
    "dim": "dp|tp|sp|cp|ep|pp",
    "r": r"\d+",
    "collective": "all_reduce|all_gather|reduce_scatter",
    "component": r"[a-z][a-z0-9_]*",  # a model spec's names: embedding, attention, ffn, ...
    "memory_part": (
        "weights|master_weights|weight_copies|gradients|optimizer_state|activations|workspace|total"
    ),
    "time_part": "compute|bubble|dp|tp|sp|cp|ep|pp|overhead",
    "precision": "fp32|tf32|bf16|fp16|fp8",
    "link": "all_reduce|p2p",
    "figure": ".+",  # a measured figure with a prediction: checked in `matches`
    "node": r"node_\d+",  # a node of a job on several: MLflow's node id
    "system": r"[a-z][a-z0-9_]*",  # MLflow's names: cpu_utilization_percentage, gpu_0_...
}
PLACEHOLDER = re.compile(r"<(\w+)>")

# Units. A fraction is of 1; "" is a plain number (a loss, an example's value).
SECONDS, FRACTION, BYTES, GIB, GBS = "s", "fraction", "B", "GiB", "GB/s"
KWH, USD, HOURS, COUNT = "kWh", "USD", "h", "count"

# Writers: the module where the logged key is made.
MODULE = "runner.training.module"
LIGHTNING = "pytorch_lightning.trainer.connectors.logger_connector.logger_connector"
TIMING = "runner.training.callbacks.rank_timing"
ROUTER = "runner.training.callbacks.router"
PROFILER = "runner.training.sampled_profile"
TRAINING = "runner.training.rank"
RECORD = "runner.training.record"
PLANNER = "runner.planner"
FAILURES = "runner.planner.failures"
EXAMPLE = "runner.modes.example"
PLAN = "runner.modes.plan"
CALIBRATE = "runner.modes.calibrate"
REPORT = "runner.modes.report"
SYSTEM = "mlflow.system_metrics"  # through runner.training.callbacks.system_metrics


@dataclass(frozen=True)
class Metric:
    name: str  # the logged key, or a pattern of keys
    unit: str
    meaning: str  # one line
    writer: str  # the module that makes the key
    mode: str = "train"  # the runs that log it: mode=train (a failed job's too), example, ...

    def at(self, **parts: object) -> str:
        """The concrete name, each `<part>` of the pattern filled in."""
        wanted = PLACEHOLDER.findall(self.name)
        if sorted(wanted) != sorted(parts):
            raise ValueError(f"{self.name} takes {wanted}, not {sorted(parts)}")
        return PLACEHOLDER.sub(lambda m: str(parts[m.group(1)]), self.name)

    @property
    def group(self) -> str:
        """The outer key of a figure its writer keeps nested."""
        return self.name.split("/")[0]

    @property
    def leaf(self) -> str:
        """The inner key of a figure its writer keeps nested."""
        return self.name.rsplit("/", 1)[-1]

    def matches(self, key: str) -> bool:
        found = _regex(self.name).fullmatch(key)
        if found is None:
            return False
        figure = found.groupdict().get("figure")
        return figure is None or predicted(figure)


@functools.cache
def _regex(pattern: str) -> re.Pattern[str]:
    """The keys a pattern stands for: its text as it is, each placeholder as PARTS says."""
    pieces = PLACEHOLDER.split(pattern)  # text, part, text, part, ..., text
    return re.compile(
        "".join(
            f"(?P<{piece}>{PARTS[piece]})" if i % 2 else re.escape(piece)
            for i, piece in enumerate(pieces)
        )
    )


REGISTRY: list[Metric] = []  # in the order the entries are made below


def entry(name: str, unit: str, meaning: str, writer: str, mode: str = "train") -> Metric:
    """A new entry, registered."""
    made = Metric(name, unit, meaning, writer, mode)
    REGISTRY.append(made)
    return made


def registered(key: str, mode: str | None = None) -> Metric | None:
    """The entry a logged key is (of that mode, if given), or None: not a metric of the runner."""
    return next((m for m in REGISTRY if mode in (None, m.mode) and m.matches(key)), None)


# --- a figure's other forms ---

RANK_FORM, WORST_FORM, PREDICTED_FORM = "rank_<r>/", "_max", "pred/"


def per_rank(*figures: Metric) -> tuple[Metric, ...]:
    """Register each figure's per-rank form, `rank_<r>/<name>`; the figures, to loop over."""
    for figure in figures:
        entry(RANK_FORM + figure.name, figure.unit, f"rank <r>'s own {figure.name}", TIMING)
    return figures


def with_worst(*figures: Metric) -> tuple[Metric, ...]:
    """Register each figure's largest value over ranks, `<name>_max`."""
    for figure in figures:
        entry(figure.name + WORST_FORM, figure.unit, f"the worst rank's {figure.name}", TIMING)
    return figures


def of_rank(figure: Metric, r: int) -> str:
    """A rank's own value of a figure: rank_3/idle_fraction."""
    return _form(RANK_FORM + figure.name).at(r=r)


def worst(figure: Metric) -> str:
    """The largest value over ranks of a figure: idle_fraction_max."""
    return _form(figure.name + WORST_FORM).name


def _form(name: str) -> Metric:
    """The registered entry of that name: a form nobody registered is a mistake."""
    found = next((m for m in REGISTRY if m.name == name), None)
    if found is None:
        raise KeyError(f"{name} is not registered in runner/metrics.py")
    return found


# --- training: the losses ---

TRAIN_LOSS = entry("train_loss", "", "the training loss of each step", MODULE)
VAL_LOSS = entry("val_loss", "", "the validation loss, at each validation", MODULE)
EPOCH = entry("epoch", COUNT, "the epoch, which Lightning logs beside every loss", LIGHTNING)
# A mixture of experts' router, each step, over every rank's tokens (model=moe)
ROUTER_LOAD = entry(
    "router/load_max_over_mean", "", "the busiest expert's tokens / the mean, worst block", ROUTER
)
ROUTER_DROPPED = entry(
    "router/dropped_fraction", "", "the share of routed tokens dropped at a full expert", ROUTER
)
ROUTER_BALANCE = entry(
    "router/balance_loss", "", "the load-balancing loss, the mean over blocks", ROUTER
)

# --- training: where a step's time goes (means over ranks, after warm-up) ---

STEP_TIME = entry("step_time_s", SECONDS, "wall time of one optimizer step", TIMING)
COMPUTE_TIME = entry("compute_time_s", SECONDS, "forward, backward, optimizer work", TIMING)
COMM_TIME = entry("comm_time_s", SECONDS, "time blocked in a collective or a P2P wait", TIMING)
IDLE_TIME = entry("idle_time_s", SECONDS, "step wall time - compute", TIMING)
IDLE_FRACTION = entry("idle_fraction", FRACTION, "idle time / step wall time", TIMING)
with_worst(IDLE_FRACTION)
RANKED_TIMES = per_rank(COMPUTE_TIME, COMM_TIME, IDLE_FRACTION)

THROUGHPUT = entry(
    "throughput_samples_per_s", "samples/s", "global batch / mean loop interval", TRAINING
)
TOKEN_THROUGHPUT = entry(
    "throughput_tokens_per_s", "tokens/s", "samples/s x tokens per sample", TRAINING
)
TRAIN_TIME = entry("train_time_s", SECONDS, "the wall time of training", TRAINING)
ENERGY = entry("energy_kwh", KWH, "training time x devices x power x PUE", FAILURES)
COST = entry("cost_usd", USD, "the energy x the price per kWh", FAILURES)
MFU = entry("mfu", FRACTION, "model FLOPs per step / step time / the devices' peak", RECORD)

# --- training: memory (the busiest rank's, and each rank's) ---

PEAK_MEMORY = entry("peak_memory_gib", GIB, "the most memory a rank used for training", TIMING)
PEAK_ALLOCATED = entry(
    "peak_allocated_gib", GIB, "the most a rank's tensors held at once (malloc's, CUDA's)", TIMING
)
HELD_FOR_BACKWARD = entry(
    "activations_gib", GIB,
    "what forward left for backward: tensors held at its end less at the step's start", TIMING,
)  # fmt: skip
WORKSPACE = entry(
    "workspace_gib", GIB,
    "in use between steps beyond the rank's weights, gradients and optimizer state: the math"
    " library's buffers (cuBLAS's workspace, a CPU BLAS's packing buffers)", TIMING,
)  # fmt: skip
PEAKS = per_rank(PEAK_MEMORY, PEAK_ALLOCATED, HELD_FOR_BACKWARD, WORKSPACE)

# --- training: communication (2 or more processes) ---

COMM_BYTES_PER_STEP = entry(
    "comm_bytes_per_step/<dim>", BYTES, "the payload a rank handed to the dimension a step", TIMING
)
COMM_BYTES_BY_COLLECTIVE = entry(
    "comm_bytes_per_step/dp/<collective>", BYTES, "sharded dp's payload of one collective", TIMING
)
COMM_ALGBW = entry(
    "comm_algbw_gbs/<dim>", GBS, "payload / the time a transfer was in flight", TIMING
)
COMM_BUSBW = entry(
    "comm_busbw_gbs/<dim>", GBS, "nccl-tests' bus bandwidth of the dimension", TIMING
)
BUBBLE_MEASURED = entry(
    "bubble_fraction_measured", FRACTION, "what a pipeline's window leaves idle", TIMING
)

# --- training: the sampled profiler's breakdown (trainer.profile_every_n_steps) ---

DEVICE_IDLE_FRACTION = entry(
    "device_idle_fraction", FRACTION, "the traced step's time no kernel ran / the step", PROFILER
)
DEVICE_COMPUTE_FRACTION = entry(
    "device_compute_fraction", FRACTION, "the time a compute kernel ran / the step", PROFILER
)
DEVICE_COMM_FRACTION = entry(
    "device_comm_fraction", FRACTION, "the time a communication kernel ran / the step", PROFILER
)
COMM_OVERLAP_FRACTION = entry(
    "comm_overlap_fraction", FRACTION, "communication time compute overlapped / its time", PROFILER
)
PROFILED = per_rank(
    *with_worst(
        DEVICE_IDLE_FRACTION, DEVICE_COMPUTE_FRACTION, DEVICE_COMM_FRACTION, COMM_OVERLAP_FRACTION
    )
)

# --- training: the planner's predictions ---


def prediction(key: str) -> str:
    """What the planner's prediction of a measured key is logged as."""
    if key == BUBBLE_MEASURED.name:
        return BUBBLE_THEORY.name
    return PREDICTED_FORM + key


def predicted(key: str) -> bool:
    """Whether a key is a measured training figure the planner predicts."""
    return registered(key, "train") is not None and registered(prediction(key), "train") is not None


def with_prediction(figure: Metric, meaning: str) -> Metric:
    """Register the planner's prediction of a figure, `pred/<name>`: read as `prediction(key)`."""
    entry(PREDICTED_FORM + figure.name, figure.unit, meaning, PLANNER)
    return figure


with_prediction(STEP_TIME, "the planner's step time")
with_prediction(MFU, "the planner's MFU")
with_prediction(PEAK_MEMORY, "the planner's memory per device")
with_prediction(HELD_FOR_BACKWARD, "the planner's activations per device")
with_prediction(WORKSPACE, "the profile's workspace_mib at the run's precision")
with_prediction(IDLE_FRACTION, "the planner's idle fraction")
with_prediction(COMM_BYTES_PER_STEP, "the planner's payload")
with_prediction(COMM_BYTES_BY_COLLECTIVE, "the planner's payload of one collective")
with_prediction(COMM_BUSBW, "the profile's link: bandwidth x efficiency")
PRED_RING_BYTES = entry(
    "pred/ring_bytes_per_step/dp", BYTES, "the bytes on each rank's dp link a step", PLANNER
)
BUBBLE_THEORY = entry(
    "bubble_fraction_theory", FRACTION, "(p - 1) / (v*m + p - 1): the pipeline's bubble", PLANNER
)

# --- training: MLflow's system metrics, one series per node (logger.system_metrics) ---

SYSTEM_METRIC = entry(
    "system/<system>", "", "MLflow's CPU, memory, disk, network (and GPU) sample", SYSTEM
)
SYSTEM_METRIC_OF_NODE = entry(
    "system/<node>/<system>", "", "the same, of one node of a job on several", SYSTEM
)

# --- training: a failed job's lost work ---

LOST_STEPS = entry("lost_steps", COUNT, "steps since the last snapshot, to redo", FAILURES)
LOST_TIME = entry("lost_time_s", SECONDS, "the time since the last snapshot", FAILURES)
LOST_ENERGY = entry("lost_energy_kwh", KWH, "the devices' energy over the lost time", FAILURES)
LOST_COST = entry("lost_cost_usd", USD, "the price of the lost energy", FAILURES)

# --- mode=example: the seed's worked examples ---


def example(name: str, meaning: str) -> Metric:
    return entry(name, "", meaning, EXAMPLE, "example")


EXAMPLE_Z = example("z", "the neuron's weighted sum")
EXAMPLE_Y_HAT = example("y_hat", "the model's output")
EXAMPLE_Y_HAT_RELU = example("y_hat_relu", "the neuron's output through ReLU")
EXAMPLE_Z_SHIFTED = example("z_shifted", "the weighted sum after the bias weight moved")
EXAMPLE_Y_HAT_SHIFTED = example("y_hat_shifted", "the output after the bias weight moved")
EXAMPLE_LOSS = example("loss", "half the squared error")
EXAMPLE_DLOSS_DYHAT = example("dloss_dyhat", "the loss's gradient by the output")
EXAMPLE_ERROR_TERM_B = example("error_term_b", "dE/dz of layer b")
EXAMPLE_ERROR_TERM_A = example("error_term_a", "dE/dz of layer a")
EXAMPLE_GRAD_W_A1 = example("grad_w_a1", "the gradient of layer a's first weight")
EXAMPLE_GRAD_W_B1 = example("grad_w_b1", "the gradient of layer b's first weight")
EXAMPLE_W_A1_NEW = example("w_a1_new", "layer a's first weight after one SGD step")
EXAMPLE_W_B1_NEW = example("w_b1_new", "layer b's first weight after one SGD step")
EXAMPLE_Y_HAT_AFTER = example("y_hat_after", "the output after the step")
EXAMPLE_LOSS_AFTER = example("loss_after", "the loss after the step")

# --- mode=plan: the planner's figures for one job ---


def planned(name: str, unit: str, meaning: str, writer: str = PLANNER) -> Metric:
    return entry(name, unit, meaning, writer, "plan")


PLAN_PARAMS = planned("params_total", COUNT, "the model's parameters", PLAN)
PLAN_PARAMS_BY_COMPONENT = planned(
    "params_by_component/<component>", COUNT, "the parameters of one component", PLAN
)
PLAN_WORLD_SIZE = planned("world_size", COUNT, "the job's devices")
PLAN_MEMORY = planned(
    "mem_per_device_gib/<memory_part>", GIB, "a device's memory for one part, and the total"
)
PLAN_COMM_BYTES_PER_STEP = planned(
    "comm_bytes_per_step/<dim>", BYTES, "the payload a rank hands to the dimension a step"
)
PLAN_COMM_BYTES_BY_COLLECTIVE = planned(
    "comm_bytes_by_collective/dp/<collective>", BYTES, "sharded dp's payload of one collective"
)
PLAN_COMM_TIME = planned("comm_time_s/<dim>", SECONDS, "the dimension's exposed transfer time")
PLAN_COMM_HIDDEN = planned("comm_hidden_s/<dim>", SECONDS, "its transfer time compute hides")
PLAN_TIME_BY_PART = planned("time_by_part_s/<time_part>", SECONDS, "the step by what spends it")
PLAN_BUBBLE = planned("bubble_fraction", FRACTION, "the pipeline's bubble, in theory")
PLAN_STEP_TIME = planned("step_time_s", SECONDS, "the step's time")
PLAN_IDLE_FRACTION = planned("idle_fraction", FRACTION, "1 - compute / the step's time")
PLAN_TOKENS_PER_S = planned("tokens_per_s", "tokens/s", "the job's throughput")
PLAN_MFU = planned("mfu", FRACTION, "model FLOPs utilization")
PLAN_HOURS = planned("hours", HOURS, "the job's duration: plan.hours, plan.tokens or max_steps")
PLAN_ENERGY = planned("energy_kwh", KWH, "the devices' energy over the duration, with PUE")
PLAN_COST = planned("cost_usd", USD, "the energy's price")
PLAN_MTBF = planned(
    "snapshots/job_mtbf_hours", HOURS, "mean time between the job's failures", FAILURES
)
PLAN_SNAPSHOT_INTERVAL = planned(
    "snapshots/snapshot_interval_s", SECONDS, "Young's interval between snapshots", FAILURES
)
PLAN_WASTE = planned(
    "snapshots/expected_waste_fraction", FRACTION, "time lost to snapshots and failures", FAILURES
)
PLAN_LOST_COST = planned(
    "snapshots/expected_lost_cost_usd", USD, "the price of the expected waste", FAILURES
)
PLAN_DEVICE_MEMORY = planned(
    "memory_per_device_gib", GIB, "a device's memory: the profile's, or this host's", PLAN
)
PLAN_FITS = planned("fits", "", "1 if the job fits in a device's memory, else 0", PLAN)

# --- mode=search: which layout ---

SEARCH = "runner.modes.search"


def searched(name: str, unit: str, meaning: str) -> Metric:
    return entry(name, unit, meaning, SEARCH, "search")


SEARCH_LAYOUTS = searched("search/layouts", COUNT, "layouts searched, the refused included")
SEARCH_SECONDS = searched("search/seconds", SECONDS, "the search's time, the record aside")
SEARCH_FIT = searched("search/fit", COUNT, "layouts that pass the rules and fit")
SEARCH_BY_RULES = searched("search/refused_by_rules", COUNT, "layouts a layout rule refused")
SEARCH_BY_MEMORY = searched("search/refused_by_memory", COUNT, "layouts too large for a device")
SEARCH_BEST = {  # the best layout's planned figures, by the Priced field that holds each
    "step_time_s": searched("best/step_time_s", SECONDS, "the best layout's step time"),
    "mfu": searched("best/mfu", FRACTION, "the best layout's model FLOPs utilization"),
    "memory_gib": searched("best/memory_gib", GIB, "the best layout's memory per device"),
    "bubble": searched("best/bubble_fraction", FRACTION, "the best layout's bubble, in theory"),
    "hours": searched("best/hours", HOURS, "the best layout's duration (as mode=plan's)"),
    "cost_usd": searched("best/cost_usd", USD, "the best layout's energy price"),
}

# --- mode=calibrate: this host measured ---


def calibrated(name: str, unit: str, meaning: str) -> Metric:
    return entry(name, unit, meaning, CALIBRATE, "calibrate")


CALIBRATE_THREADS = calibrated("threads", COUNT, "the threads each rank gets")
CALIBRATE_CORES = calibrated("cores", COUNT, "the host's cores")
CALIBRATE_MATMUL = calibrated(
    "matmul_flops/<precision>", "FLOP/s", "the best square product, scaled to the host's cores"
)
CALIBRATE_MEMORY_BANDWIDTH = calibrated(
    "memory_bandwidth_bytes_s", "B/s", "a large copy, read and written"
)
CALIBRATE_STEP_TIME = calibrated("step_time_s", SECONDS, "the runner's own step of the model")
CALIBRATE_STEP_OVERHEAD = calibrated(
    "step_overhead_s", SECONDS, "the runner's step less a plain PyTorch loop's"
)
CALIBRATE_WORKSPACE = calibrated(
    "workspace_bytes", BYTES, "the runner's rank's workspace_gib, in bytes"
)
CALIBRATE_PLAIN_STEP = calibrated("plain_step_time_s", SECONDS, "the plain PyTorch loop's step")
CALIBRATE_STEP_FLOPS = calibrated("step_flops", "FLOP/s", "model FLOPs per plain step / its time")
CALIBRATE_PRODUCTS_SHARE = calibrated(
    "products_share", FRACTION, "the plain step's share of time in matrix products"
)
CALIBRATE_LATENCY = calibrated("<link>/latency_s", SECONDS, "gloo's latency over loopback")
CALIBRATE_BANDWIDTH = calibrated("<link>/bandwidth_bytes_s", "B/s", "gloo's bandwidth, loopback")
CALIBRATE_DDP_OVERHEAD = calibrated(
    "ddp_overhead_s_per_mb", SECONDS, "what DDP adds to a step per MB of gradients, over the link"
)
CALIBRATE_TP_OVERHEAD = calibrated(
    "tp_layer_overhead_s", SECONDS, "a tensor-parallel layer's cost beyond compute and transfers"
)

# --- mode=report: how far to trust the planner ---


def reported(name: str, unit: str, meaning: str) -> Metric:
    return entry(name, unit, meaning, REPORT, "report")


REPORT_ERROR = reported(
    "median_abs_error/<figure>", FRACTION, "median |predicted - measured| / measured"
)
REPORT_SPEARMAN = reported(
    "spearman/<figure>", "", "Spearman's rank correlation of predicted and measured"
)
REPORT_RUNS = reported("runs", COUNT, "the sweep's training runs compared")
