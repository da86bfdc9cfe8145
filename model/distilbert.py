"""DistilBERT: BERT's post-LN layer under other names (q_lin, sa_layer_norm, ffn.lin1 ...: renamed
on load by model/architectures.py), no token types, no pooler, and these three heads.

Token classification and QA are BERT's heads; `distilbert.` weights are renamed to our `bert.`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .bert import (
    BertModel,
    BertPreTrainedModel,
    HeadOutput,
    activation,
    flat_choices,
    mlm_loss,
    sequence_loss,
    splade,
)
from .config import BertConfig


class DistilBertForSequenceClassification(BertPreTrainedModel):
    def __init__(self, config: BertConfig, outputs: int | None = None):
        super().__init__(config)
        self.num_labels = config.num_labels if outputs is None else outputs
        self.bert = BertModel(config)
        self.pre_classifier = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.extra.get("seq_classif_dropout", 0.2))
        self.classifier = nn.Linear(config.hidden_size, self.num_labels)
        self.init_weights()

    def scores(self, input_ids, attention_mask, token_type_ids) -> Tensor:
        hidden = self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state
        x = F.relu(self.pre_classifier(hidden[:, 0]))  # (B, T, C) -> (B, C): [CLS]
        return self.classifier(self.dropout(x))

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        logits = self.scores(input_ids, attention_mask, token_type_ids)
        return HeadOutput(logits=logits, loss=sequence_loss(logits, labels))


class DistilBertForMultipleChoice(DistilBertForSequenceClassification):
    """The classification head with one output on every choice: [batch, choices, seq] -> [batch, choices]."""

    def __init__(self, config: BertConfig):
        super().__init__(config, outputs=1)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        batch, choices, _ = input_ids.shape
        logits = self.scores(*flat_choices(input_ids, attention_mask, token_type_ids))
        logits = logits.view(batch, choices)  # (B * n, 1) -> (B, n)
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return HeadOutput(logits=logits, loss=loss)


class DistilBertForMaskedLM(BertPreTrainedModel):
    """vocab_transform -> activation -> vocab_layer_norm -> vocab_projector tied to the word embeddings
    (SPLADE's DistilBERT models read these logits)."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config)
        self.vocab_transform = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.vocab_layer_norm = nn.LayerNorm(config.hidden_size, eps=1e-12)
        self.vocab_projector = nn.Linear(config.hidden_size, config.vocab_size)
        self.init_weights()

    def tie_weights(self) -> None:
        self.vocab_projector.weight = self.bert.embeddings.word_embeddings.weight

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        hidden = self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state
        x = self.vocab_layer_norm(self.act(self.vocab_transform(hidden)))
        logits = self.vocab_projector(x)  # (B, T, C) -> (B, T, vocab)
        return HeadOutput(logits=logits, loss=mlm_loss(logits, labels) if labels is not None else None)


class DistilBertForSparseEmbedding(DistilBertForMaskedLM):
    """SPLADE's term weights from the masked-LM logits, reduced inside the graph (model.bert.splade)."""

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        logits = super().forward(input_ids, attention_mask, token_type_ids).logits  # (B, T, vocab)
        return HeadOutput(sparse=splade(logits, attention_mask))  # (B, vocab)
