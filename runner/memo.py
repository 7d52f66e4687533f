"""Work that jobs differing only in their layout share. A search (runner/search/) prices thousands
of jobs with one model, data, hardware profile and precision: the same stage, tensor split and
micro-batch recur across meshes, schedules and sharding levels. A function decorated with `shared`
keeps its answers in the job's memo (Job.memo, one dict all of a search's jobs hold), under the
layout's fields it reads (its `key`); a job without a memo (every run, every plan) computes afresh.
Torch-free.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
_MISSING = object()


def shared(key: Callable[..., Hashable]) -> Callable[[F], F]:
    """Keep `fn(job, ...)` in job.memo under (fn, key(job, ...))."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def kept(job: Any, *args: Any, **kwargs: Any) -> Any:
            memo = job.memo
            if memo is None:
                return fn(job, *args, **kwargs)
            at = (kept, key(job, *args, **kwargs))
            found = memo.get(at, _MISSING)
            if found is _MISSING:
                found = memo[at] = fn(job, *args, **kwargs)
            return found

        return kept  # type: ignore[return-value]

    return decorate


def stages_key(job: Any, *more: Hashable) -> tuple[Hashable, ...]:
    """What all the stages' parameters depend on: the pipeline's split of the layers, the tensor
    split (the vocabulary's too) and the experts' placement."""
    split = job.parallel.split
    return (job.mesh.pp, job.parallel.virtual_stages, split and tuple(split), job.mesh.tp,
            job.vocab_tp, job.mesh.ep, *more)  # fmt: skip


def stage_key(job: Any, index: int, *more: Hashable) -> tuple[Hashable, ...]:
    """What a stage's parameters depend on: its layers (as far as they differ: the spec's
    stage_shape), whether it holds the model's ends, the tensor split (the vocabulary's too) and
    the experts' placement."""
    layers, last = job.stages[index], len(job.stages) - 1
    ends = index in (0, last)
    return (job.spec.stage_shape(layers), ends, index == last, job.mesh.tp, job.vocab_tp,
            job.mesh.ep, *more)  # fmt: skip
