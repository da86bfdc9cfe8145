"""The PyTorch side: config, BERT modules and heads, checkpoints, training.

Exports resolve lazily so `model.config` (and friends) import without torch.
"""

from .config import BertConfig

_TORCH_EXPORTS = {
    "BertModel",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertForMultipleChoice",
    "BertForQuestionAnswering",
    "BertForPreTraining",
    "BertForMaskedLM",
    "BertForNextSentencePrediction",
    "TASK_HEADS",
}

__all__ = ["BertConfig", *sorted(_TORCH_EXPORTS)]


def __getattr__(name: str):
    if name in _TORCH_EXPORTS:
        from . import bert

        return getattr(bert, name)
    raise AttributeError(f"module 'model' has no attribute {name!r}")
