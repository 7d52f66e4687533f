"""Each private upstream API the runner patches fails in one clear line where it is missing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

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
    from hydra._internal import hydra as hydra_internal
    from pytorch_lightning.callbacks import TQDMProgressBar
    from torch.distributed import distributed_c10d
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous
    from torch.distributed.pipelining import schedules

    from runner.compat import (
        collectives,
        float8,
        hydra_mode,
        lightning,
        pipelining,
        process_group,
        rendezvous_events,
    )

    cases = [
        (hydra_internal.Hydra, "get_mode", hydra_mode.mode_from_the_command_line),
        (schedules, "_batch_p2p", lambda: pipelining.wrap_p2p(lambda f: f, lambda f: f)),
        (funcol, "all_reduce", lambda: collectives.wrap_functional({("all_reduce",): lambda f: f})),
        (distributed_c10d, "default_pg_timeout", lambda: process_group.set_default_timeout(60)),
        (TQDMProgressBar, "_should_update", lightning.progress_bar_base),
        (torch, "_scaled_mm", lambda: float8.float8_product(16, torch.device("cpu"))),
        (dynamic_rendezvous, "get_method_name", rendezvous_events.name_methods_cheaply),
    ]
    for owner, name, use in cases:
        with monkeypatch.context() as patched:
            patched.delattr(owner, name)
            with pytest.raises(MissingAPI, match=name):
                use()


def _counted(calls: list[str]):
    """A wrapper that notes the name of each collective it wraps."""

    def wrap(collective):
        calls.append(collective.__name__)
        return lambda *args: ("wrapped", collective(*args))

    return wrap


GATHER = ("all_gather_single", "all_gather_tensor")


def test_a_release_before_the_rename_has_its_old_collective_wrapped() -> None:
    from runner.compat.collectives import wrap_first_present

    def all_gather_tensor(t):
        return t

    funcol, wrapped = SimpleNamespace(all_gather_tensor=all_gather_tensor), []
    wrap_first_present(funcol, {GATHER: _counted(wrapped)})
    assert wrapped == ["all_gather_tensor"]
    assert funcol.all_gather_tensor(1) == ("wrapped", 1)
    assert not hasattr(funcol, "all_gather_single")


def test_with_both_names_only_the_new_one_is_wrapped_the_alias_calls_it() -> None:
    from runner.compat.collectives import wrap_first_present

    funcol = SimpleNamespace()

    def all_gather_single(t):
        return t

    def all_gather_tensor(t):  # torch 2.13's alias: looks the new name up at each call
        return funcol.all_gather_single(t)

    funcol.all_gather_single, funcol.all_gather_tensor = all_gather_single, all_gather_tensor
    wrapped: list[str] = []
    wrap_first_present(funcol, {GATHER: _counted(wrapped)})
    assert wrapped == ["all_gather_single"]
    assert funcol.all_gather_tensor is all_gather_tensor
    assert funcol.all_gather_tensor(1) == ("wrapped", 1)  # counted once, through the new name


def test_a_release_with_none_of_the_names_is_refused_in_one_line_naming_them() -> None:
    from runner.compat.collectives import wrap_first_present

    def all_reduce(t):
        return t

    funcol = SimpleNamespace(all_reduce=all_reduce)
    wrappers = {("all_reduce",): _counted([]), GATHER: _counted([])}
    with pytest.raises(MissingAPI) as missing:
        wrap_first_present(funcol, wrappers)
    line = str(missing.value)
    assert "\n" not in line
    assert "all_gather_single or " in line and ".all_gather_tensor is missing in torch" in line
    assert "checked with torch 2.13" in line
    assert funcol.all_reduce is all_reduce  # nothing wrapped when one is missing


def test_the_rendezvous_names_each_event_by_the_method_torchs_own_answer_names() -> None:
    """compat/rendezvous_events.py's frame read answers as `inspect.stack()[depth].function`
    (torch's get_method_name) at every depth above itself, and "no_method_name" past the
    stack's end."""
    import inspect

    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    from runner.compat.rendezvous_events import method_name, name_methods_cheaply

    def torchs(depth: int = 2) -> str:  # torch's own, as released
        return inspect.stack()[depth].function if len(inspect.stack()) > depth else "no_method_name"

    def record(name_of, depth):  # the rendezvous' _record: the method calling it is named
        return name_of(depth)

    def sync(name_of, depth):  # a rendezvous method
        return record(name_of, depth)

    for depth in (1, 2, 3):
        assert sync(method_name, depth) == sync(torchs, depth)
    assert sync(method_name, 2) == "sync" and method_name(10_000) == "no_method_name"
    name_methods_cheaply()
    assert dynamic_rendezvous.get_method_name is method_name
