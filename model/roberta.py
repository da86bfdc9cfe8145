"""RoBERTa, XLM-RoBERTa and CamemBERT: BERT's encoder with two switches in BertEmbeddings (positions
past the padding index, one token type) and this classification head.

Token classification, QA, multiple choice (on the pooler, as BERT) and sentence embeddings are
BERT's heads; model/architectures.py renames `roberta.` weights to our `bert.` on load.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .bert import BertModel, BertPreTrainedModel, HeadOutput, sequence_loss
from .config import BertConfig


class RobertaClassificationHead(nn.Module):
    """dense -> tanh -> out_proj on the first token (<s>); RoBERTa keeps no pooler for this."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.extra.get("classifier_dropout") or config.hidden_dropout_prob)
        self.out_proj = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, hidden: Tensor) -> Tensor:
        x = self.dropout(hidden[:, 0])  # (B, T, C) -> (B, C): <s>
        x = torch.tanh(self.dense(x))
        return self.out_proj(self.dropout(x))


class RobertaForSequenceClassification(BertPreTrainedModel):
    """Single text or text pair; `num_labels == 1` is regression with MSE (a cross-encoder)."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertModel(config, add_pooler=False)
        self.classifier = RobertaClassificationHead(config)
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        hidden = self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state
        logits = self.classifier(hidden)
        return HeadOutput(logits=logits, loss=sequence_loss(logits, labels))
