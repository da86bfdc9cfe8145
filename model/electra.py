"""The ELECTRA discriminator: BERT's encoder with narrower embeddings projected up (the
`embeddings_project` switch in BertModel), no pooler, and these two heads.

Token classification and QA are BERT's heads; `electra.` weights are renamed to our `bert.` on load.
"""

from __future__ import annotations

from torch import Tensor, nn
from torch.nn import functional as F

from .bert import BertModel, BertPreTrainedModel, HeadOutput, activation, flat_choices, sequence_loss
from .config import BertConfig
from .roberta import RobertaClassificationHead


class ElectraForSequenceClassification(BertPreTrainedModel):
    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertModel(config)
        # transformers: get_activation("gelu") on [CLS], whatever hidden_act says
        self.classifier = RobertaClassificationHead(config, act=F.gelu)
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        hidden = self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state
        logits = self.classifier(hidden)
        return HeadOutput(logits=logits, loss=sequence_loss(logits, labels))


class SequenceSummary(nn.Module):
    """transformers' summary of a sequence as ElectraConfig's defaults configure it: the first token,
    a projection (summary_use_proj), an activation (summary_activation, gelu), dropout."""

    def __init__(self, config: BertConfig):
        super().__init__()
        extra = config.extra
        if extra.get("summary_type", "first") != "first":
            raise ValueError(f"ELECTRA summary_type {extra['summary_type']!r}: only 'first' is implemented")
        self.summary = nn.Identity()
        if extra.get("summary_use_proj", True):
            to_labels = extra.get("summary_proj_to_labels", False) and config.num_labels > 0
            width = config.num_labels if to_labels else config.hidden_size
            self.summary = nn.Linear(config.hidden_size, width)
        name = extra.get("summary_activation", "gelu")
        self.act = activation(name) if name else (lambda x: x)
        self.last_dropout = nn.Dropout(extra.get("summary_last_dropout", 0.1))

    def forward(self, hidden: Tensor) -> Tensor:
        return self.last_dropout(self.act(self.summary(hidden[:, 0])))  # (B, T, C) -> (B, C)


class ElectraForMultipleChoice(BertPreTrainedModel):
    """Inputs [batch, choices, seq]; the summary of each choice's first token, scored by one Linear."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config)
        self.sequence_summary = SequenceSummary(config)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        batch, choices, _ = input_ids.shape
        hidden = self.bert(*flat_choices(input_ids, attention_mask, token_type_ids)).last_hidden_state
        logits = self.classifier(self.sequence_summary(hidden)).view(batch, choices)  # (B * n, 1) -> (B, n)
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return HeadOutput(logits=logits, loss=loss)
