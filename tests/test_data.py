"""The data: the seed's reserved token ids, held-out blocks, shards of the same global batches."""

import pytest
import torch

from runner.data.sampling import ShardedBatchSampler
from runner.data.text import load_text, train_tokenizer


def test_the_tokenizer_reserves_0_for_padding_and_1_for_unknown() -> None:
    tokenizer = train_tokenizer("the cat sat on the mat. " * 50, vocab_size=300)
    assert (tokenizer.token_to_id("<pad>"), tokenizer.token_to_id("<unk>")) == (0, 1)
    ids = tokenizer.encode("the cat").ids
    assert min(ids) > 1  # real text is never padding or unknown: byte-level BPE covers it all
    assert tokenizer.decode(ids) == "the cat"


def test_validation_blocks_are_held_out_from_training(tmp_path) -> None:
    splits = load_text(vocab_size=512, seq_len=32, cache_dir=str(tmp_path), val_fraction=0.1)
    assert not set(splits.train.blocks) & set(splits.val.blocks)
    assert len(splits.val) == pytest.approx(0.1 * (len(splits.train) + len(splits.val)), abs=1)
    x, y = splits.train[0]
    assert torch.equal(x[1:], y[:-1])  # targets are the next tokens


def batches(world: int, rank: int, epoch: int = 0) -> list[list[int]]:
    sampler = ShardedBatchSampler(100, global_batch=8, rank=rank, world=world, seed=3)
    sampler.set_epoch(epoch)
    return list(sampler)


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_take_disjoint_shards_of_the_single_process_batches(world: int) -> None:
    whole = batches(1, 0)
    shards = [batches(world, r) for r in range(world)]
    for step, batch in enumerate(whole):
        assert sum((s[step] for s in shards), []) == batch
    assert len(whole) == 100 // 8  # the partial last batch is dropped everywhere


def test_each_epoch_draws_a_new_order_the_same_on_every_rank() -> None:
    assert batches(1, 0, epoch=0) != batches(1, 0, epoch=1)
    assert batches(2, 1, epoch=1) == batches(2, 1, epoch=1)
