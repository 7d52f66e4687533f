"""Lightning's SIGTERM handling, replaced. Lightning 2.6 notes a SIGTERM and broadcasts rank 0's
flag before every step: one more blocking collective a step, 5-10 % of a small model's DDP step
here (Lightning issue 21487; PR 21640 would add `broadcast_sigterm_every_n_steps`); and its
handler broadcasts too, which over a group that lost a rank raises inside whatever the rank was
doing (seen: rank 0 writing its last losses). Both are private attributes of the Trainer. And the
progress bar's private `_should_update`, which the runner's bar overrides to redraw at most four
times a second. Checked on pytorch-lightning 2.6.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runner.compat import private

CHECKED = "2.6"


def progress_bar_base() -> type:
    """Lightning's TQDMProgressBar, whose private `_should_update` the runner's bar overrides."""
    from pytorch_lightning.callbacks import TQDMProgressBar

    private(TQDMProgressBar, "_should_update", "TQDMProgressBar", "pytorch-lightning", CHECKED)
    return TQDMProgressBar


def replace_sigterm_handling(trainer: Any, handler: Callable[..., Any]) -> None:
    """No flag broadcast before each step; `handler` runs on SIGTERM instead of Lightning's."""
    loop, package = trainer.fit_loop.epoch_loop, "pytorch-lightning"
    private(loop, "_broadcast_sigterm_tensor", "fit_loop.epoch_loop", package, CHECKED)
    connector = private(trainer, "_signal_connector", "Trainer", package, CHECKED)
    private(connector, "_sigterm_notifier_fn", "Trainer._signal_connector", package, CHECKED)
    loop._broadcast_sigterm_tensor = lambda: None
    connector._sigterm_notifier_fn = handler
