"""The tests' tiny random checkpoints: model/tiny.py, where the benchmarks' smoke runs find them too."""

from model.tiny import (  # noqa: F401
    SPECIAL,
    TASK_LABELS,
    WORDS,
    make_tiny_checkpoint,
    tiny_config,
    tiny_sizes,
    tiny_vocab,
    write_tokenizer_files,
)
