"""Snapshots keep every generator a resumed run draws from: the CPU's and each CUDA device's.
CUDA is faked here, so the GPU path is checked on any machine; the CPU's is checked for real."""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from runner.snapshots import (
    check_files,
    rng_entries,
    rng_of,
    rng_state,
    set_rng_state,
    stored_rng,
)

DEVICES = 2
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class FakeCuda:
    """Two devices whose states are distinct byte patterns; what set_rng_state_all received."""

    def __init__(self, available: bool = True, initialized: bool = True) -> None:
        self.available, self.initialized = available, initialized
        self.states = [torch.full((16,), 7 * i + 1, dtype=torch.uint8) for i in range(DEVICES)]
        self.got: list[list[torch.Tensor]] = []
        self.asked = 0

    def get_rng_state_all(self) -> list[torch.Tensor]:
        self.asked += 1
        return [s.clone() for s in self.states]

    def set_rng_state_all(self, states: list[torch.Tensor]) -> None:
        self.got.append([s.clone() for s in states])

    @contextmanager
    def installed(self) -> Iterator[None]:
        """Only around the calls under test: DCP's writer asks torch.cuda too, for real."""
        with pytest.MonkeyPatch.context() as monkeypatch:
            self.install(monkeypatch)
            yield

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "is_available", lambda: self.available)
        monkeypatch.setattr(cuda, "is_initialized", lambda: self.initialized)
        monkeypatch.setattr(cuda, "device_count", lambda: DEVICES if self.available else 0)
        monkeypatch.setattr(cuda, "get_rng_state_all", self.get_rng_state_all)
        monkeypatch.setattr(cuda, "set_rng_state_all", self.set_rng_state_all)


def assert_same(got: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert a.dtype == torch.uint8 and torch.equal(a, b)


def test_every_devices_state_round_trips(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeCuda()
    fake.install(monkeypatch)
    state = rng_state()
    assert_same(state["cuda"], fake.states)
    set_rng_state(state)
    assert len(fake.got) == 1
    assert_same(fake.got[0], fake.states)


@pytest.mark.parametrize("available, initialized", [(False, False), (True, False)])
def test_without_cuda_in_use_nothing_cuda_is_called(
    monkeypatch: pytest.MonkeyPatch, available: bool, initialized: bool
) -> None:
    fake = FakeCuda(available, initialized)
    fake.install(monkeypatch)
    state = rng_state()
    assert "cuda" not in state and fake.asked == 0  # asking would start CUDA in this process
    set_rng_state(state)
    assert fake.got == []


def test_a_snapshot_with_cuda_states_resumed_without_cuda_restores_the_cpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeCuda(available=False, initialized=False)
    fake.install(monkeypatch)
    before = torch.get_rng_state()
    set_rng_state({"cpu": before, "cuda": FakeCuda().states})
    assert fake.got == [] and torch.equal(torch.get_rng_state(), before)


def test_devices_this_host_lacks_are_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeCuda()
    fake.install(monkeypatch)
    more = [*fake.states, torch.zeros(16, dtype=torch.uint8)]
    set_rng_state({"cpu": torch.get_rng_state(), "cuda": more})
    assert_same(fake.got[0], fake.states)


def test_the_cpu_generator_resumes_where_it_was() -> None:
    torch.manual_seed(3)
    state = rng_state()
    expected = torch.rand(8)
    torch.rand(100)  # the run goes on past the snapshot
    set_rng_state(state)
    assert torch.equal(torch.rand(8), expected)


def save_entries(folder: Path, entries: dict[str, Any]) -> None:
    dcp.save(entries, checkpoint_id=str(folder))


def test_states_go_through_dcp_per_rank_and_device(tmp_path: Path) -> None:
    """Each device's state is its own tensor entry; a rank reads back only its own; the metadata
    still passes the restricted unpickler."""
    fake = FakeCuda()
    with fake.installed():
        mine = rng_state()
    other = {"cpu": torch.zeros_like(mine["cpu"]), "cuda": [s + 100 for s in fake.states]}
    save_entries(tmp_path, rng_entries(1, mine) | rng_entries(0, other))
    check_files(tmp_path)

    entries = stored_rng(tmp_path, 1)
    assert set(entries) == {"rng/1", *(f"rng_cuda/1/{i}" for i in range(DEVICES))}
    dcp.load(entries, checkpoint_id=str(tmp_path))
    loaded = rng_of(1, entries)
    assert torch.equal(loaded["cpu"], mine["cpu"])
    assert_same(loaded["cuda"], fake.states)
    with fake.installed():
        set_rng_state(loaded)
    assert_same(fake.got[0], fake.states)


def test_an_older_snapshot_with_the_cpus_state_alone_still_resumes(tmp_path: Path) -> None:
    torch.manual_seed(5)
    save_entries(tmp_path, {"rng/0": torch.get_rng_state()})  # the layout before CUDA states
    expected = torch.rand(4)
    entries = stored_rng(tmp_path, 0)
    assert set(entries) == {"rng/0"}
    dcp.load(entries, checkpoint_id=str(tmp_path))
    fake = FakeCuda()
    with fake.installed():
        set_rng_state(rng_of(0, entries))
    assert torch.equal(torch.rand(4), expected)
    assert fake.got == []  # nothing stored for the devices: theirs are left as they are
