"""English text that ships with CPython, tokenized by a byte-level BPE trained on it here.

The corpus is `pydoc_data.topics` (the documentation topics behind `help()`): real English on every
machine with Python, nothing downloaded, nothing third-party in the repository. The tokenizer and
the token ids are cached on disk, keyed by the corpus and the vocabulary size, and written
atomically so that ranks starting together never read half a file.
"""

import hashlib
import os
from pathlib import Path

import torch
from torch.utils.data import Dataset

from runner.data import Splits, digest

PAD, UNK = "<pad>", "<unk>"  # ids 0 and 1, as the seed reserves them


def corpus() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics))


def train_tokenizer(text: str, vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, UNK],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([text], trainer=trainer)
    return tokenizer


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    write(tmp)
    os.replace(tmp, path)


def token_ids(vocab_size: int, cache_dir: str) -> torch.Tensor:
    """The whole corpus as token ids, from the cache when an identical one was made before."""
    text = corpus()
    key = hashlib.sha256(f"{vocab_size}\n{text}".encode()).hexdigest()[:16]
    cache = Path(cache_dir)
    ids_path, tok_path = cache / f"text-{key}.pt", cache / f"tokenizer-{key}.json"
    if ids_path.exists():
        return torch.load(ids_path, weights_only=True)
    cache.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(text, vocab_size)
    ids = torch.tensor(tokenizer.encode(text).ids, dtype=torch.int32)
    _atomic_write(tok_path, lambda p: tokenizer.save(str(p)))
    _atomic_write(ids_path, lambda p: torch.save(ids, p))
    return ids


class TokenBlocks(Dataset):
    """Windows of seq_len + 1 tokens (input ids and next-token targets), chosen by block index."""

    def __init__(self, ids: torch.Tensor, seq_len: int, blocks: list[int]) -> None:
        self.ids, self.seq_len, self.blocks = ids.long(), seq_len, blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = self.blocks[i] * self.seq_len
        chunk = self.ids[start : start + self.seq_len + 1]
        return chunk[:-1], chunk[1:]


def load_text(
    vocab_size: int, seq_len: int, cache_dir: str, val_fraction: float = 0.1, **_: object
) -> Splits:
    ids = token_ids(vocab_size, cache_dir)
    n_blocks = (len(ids) - 1) // seq_len
    # Every k-th block is held out: spread over all topics, so validation measures the same
    # English the model trains on rather than the alphabetically last topics.
    k = round(1 / val_fraction) if val_fraction > 0 else n_blocks + 1
    val = [b for b in range(n_blocks) if b % k == k - 1]
    train = [b for b in range(n_blocks) if b % k != k - 1]
    content = digest(ids, f"seq_len={seq_len} held out every {k}")
    return Splits(
        TokenBlocks(ids, seq_len, train), TokenBlocks(ids, seq_len, val), seq_len, content
    )
