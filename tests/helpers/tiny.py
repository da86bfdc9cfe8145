"""The tests' tiny random checkpoints live in model/tiny.py, where the benchmarks' smoke runs find them too."""

from model.tiny import SPECIAL, TASK_LABELS, WORDS, make_tiny_checkpoint, tiny_config, tiny_sizes, tiny_vocab
from model.tiny import write_tokenizer_files

__all__ = [
    "SPECIAL", "TASK_LABELS", "WORDS", "make_tiny_checkpoint", "tiny_config", "tiny_sizes", "tiny_vocab",
    "write_tokenizer_files",
]  # fmt: skip
