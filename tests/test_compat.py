"""Each private upstream API the runner patches fails in one clear line where it is missing."""

from __future__ import annotations

import pytest

from runner.compat import MissingAPI, private


def test_a_missing_private_api_is_named_with_the_release_and_the_checked_ones() -> None:
    import torch

    with pytest.raises(MissingAPI) as missing:
        private(torch, "_no_such_thing", "torch", "torch", "2.13")
    line = str(missing.value)
    assert "\n" not in line
    assert f"torch._no_such_thing is missing in torch {torch.__version__}" in line
    assert "checked with torch 2.13" in line


def test_each_wrapper_refuses_a_release_without_its_api(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed._functional_collectives as funcol
    from pytorch_lightning.callbacks import TQDMProgressBar
    from torch.distributed import distributed_c10d
    from torch.distributed.pipelining import schedules

    from runner.compat import collectives, lightning, pipelining, process_group

    cases = [
        (schedules, "_batch_p2p", lambda: pipelining.wrap_p2p(lambda f: f, lambda f: f)),
        (funcol, "all_reduce", lambda: collectives.wrap_functional({"all_reduce": lambda f: f})),
        (distributed_c10d, "default_pg_timeout", lambda: process_group.set_default_timeout(60)),
        (TQDMProgressBar, "_should_update", lightning.progress_bar_base),
    ]
    for owner, name, use in cases:
        with monkeypatch.context() as patched:
            patched.delattr(owner, name)
            with pytest.raises(MissingAPI, match=name):
                use()
