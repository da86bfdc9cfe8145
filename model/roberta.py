"""RoBERTa, XLM-RoBERTa and CamemBERT: BERT's encoder with two switches in BertEmbeddings (positions
past the padding index, one token type), this classification head and the masked-LM head.

Token classification, QA, multiple choice (on the pooler, as BERT) and sentence embeddings are
BERT's heads; model/architectures.py renames `roberta.` weights to our `bert.` on load.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .bert import BertModel, BertPreTrainedModel, HeadOutput, mlm_loss, sequence_loss, splade
from .config import BertConfig


class RobertaClassificationHead(nn.Module):
    """dense -> act -> out_proj on the first token (<s>); RoBERTa keeps no pooler for this. MPNet's
    head is the same; ELECTRA's has GELU for tanh (`act`)."""

    def __init__(self, config: BertConfig, act: Callable[[Tensor], Tensor] = torch.tanh):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.extra.get("classifier_dropout") or config.hidden_dropout_prob)
        self.out_proj = nn.Linear(config.hidden_size, config.num_labels)
        self.act = act

    def forward(self, hidden: Tensor) -> Tensor:
        x = self.dropout(hidden[:, 0])  # (B, T, C) -> (B, C): <s> / [CLS]
        x = self.act(self.dense(x))
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


class RobertaLMHead(nn.Module):
    """dense -> GELU -> layer_norm -> decoder tied to the word embeddings (+ its own bias)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden: Tensor) -> Tensor:
        x = self.layer_norm(F.gelu(self.dense(hidden)))  # exact GELU, whatever hidden_act says
        return self.decoder(x) + self.bias  # (B, T, C) -> (B, T, vocab)


class RobertaForMaskedLM(BertPreTrainedModel):
    """Masked-LM logits per token (SPLADE's sparse vectors read them)."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooler=False)
        self.lm_head = RobertaLMHead(config)
        self.init_weights()

    def tie_weights(self) -> None:
        self.lm_head.decoder.weight = self.bert.embeddings.word_embeddings.weight

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        logits = self.lm_head(self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state)
        return HeadOutput(logits=logits, loss=mlm_loss(logits, labels) if labels is not None else None)


class RobertaForSparseEmbedding(RobertaForMaskedLM):
    """SPLADE's term weights from the masked-LM logits, reduced inside the graph (model.bert.splade)."""

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        logits = super().forward(input_ids, attention_mask, token_type_ids).logits  # (B, T, vocab)
        return HeadOutput(sparse=splade(logits, attention_mask))  # (B, vocab)
