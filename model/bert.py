"""BERT from scratch: the encoder, the task heads and the pretraining heads.

Parameter names follow the Hugging Face layout (``embeddings.word_embeddings``,
``encoder.layer.N.attention.self.query`` ...) so real checkpoints load by name
without a translation table. Attention is written out explicitly (no SDPA) so
the exported ONNX graph has the shape ONNX Runtime's fusions recognise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from processing.embed import POOLING_MODES
from processing.tasks import TASKS

from .architectures import architecture
from .config import BertConfig

ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),  # exact erf form, as in the original BERT
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


def activation(name: str):
    if name not in ACTIVATIONS:
        raise ValueError(f"unsupported hidden_act {name!r}; choose from {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


@dataclass
class EncoderOutput:
    last_hidden_state: Tensor
    pooler_output: Tensor


@dataclass
class HeadOutput:
    logits: Tensor | None = None
    loss: Tensor | None = None
    start_logits: Tensor | None = None
    end_logits: Tensor | None = None
    prediction_logits: Tensor | None = None  # MLM, [batch, seq, vocab] (masked_only: [masked, vocab])
    seq_relationship_logits: Tensor | None = None  # NSP, [batch, 2]
    mlm_loss: Tensor | None = None
    nsp_loss: Tensor | None = None
    embeddings: Tensor | None = None  # sentence embeddings, [batch, hidden]
    last_hidden_state: Tensor | None = None  # the encoder's token states, [batch, seq, hidden]
    sparse: Tensor | None = None  # SPLADE term weights, [batch, vocab]


# --------------------------------------------------------------------------- encoder


class BertEmbeddings(nn.Module):
    """word + learned position + segment, then LayerNorm and dropout. The architectures differ here
    (model/architectures.py): RoBERTa counts positions past padding, RoBERTa has one token type and
    DistilBERT none, ELECTRA's embeddings are narrower than its encoder."""

    def __init__(self, config: BertConfig):
        super().__init__()
        arch = architecture(config.model_type)
        size = config.embedding_size or config.hidden_size  # ELECTRA: embedding_size, projected in BertModel
        self.padding_idx = config.pad_token_id
        self.positions_skip_padding = arch.positions_skip_padding
        self.type_vocab_size = config.type_vocab_size
        self.word_embeddings = nn.Embedding(config.vocab_size, size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, size)
        if config.type_vocab_size > 0:  # DistilBERT has no token types
            self.token_type_embeddings = nn.Embedding(config.type_vocab_size, size)
        self.LayerNorm = nn.LayerNorm(size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        positions = torch.arange(config.max_position_embeddings).unsqueeze(0)
        self.register_buffer("position_ids", positions, persistent=False)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor) -> Tensor:
        if self.positions_skip_padding:
            # RoBERTa / XLM-R (fairseq's make_positions): real tokens count from padding_idx + 1,
            # padding tokens sit at padding_idx, wherever they are in the row.
            real = input_ids.ne(self.padding_idx).long()  # (B, T) 1 for a real token
            position_ids = torch.cumsum(real, dim=1) * real + self.padding_idx  # (B, T)
        else:
            position_ids = self.position_ids[:, : input_ids.shape[1]]  # (1, T)
        x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
        if self.type_vocab_size == 1:
            # One token type (RoBERTa, XLM-R): its row goes to every token and token_type_ids is not
            # read, so a BERT-style pair (second text type 1) cannot index past the table.
            x = x + self.token_type_embeddings.weight[0]
        elif self.type_vocab_size > 1:
            x = x + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        h = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_size = h // self.num_heads
        self.query = nn.Linear(h, h)
        self.key = nn.Linear(h, h)
        self.value = nn.Linear(h, h)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

    # B = batch, T = sequence length, C = hidden size, nh = heads, hs = head size (C = nh * hs)
    def split_heads(self, x: Tensor) -> Tensor:
        x = x.view(x.shape[0], x.shape[1], self.num_heads, self.head_size)  # (B, T, C) -> (B, T, nh, hs)
        return x.permute(0, 2, 1, 3)  # (B, nh, T, hs)

    def forward(self, x: Tensor, additive_mask: Tensor) -> Tensor:
        # x: (B, T, C); additive_mask: (B, 1, 1, T), 0 for a token, a large negative for padding
        q = self.split_heads(self.query(x))  # (B, nh, T, hs)
        k = self.split_heads(self.key(x))  # (B, nh, T, hs)
        v = self.split_heads(self.value(x))  # (B, nh, T, hs)
        # (B, nh, T, hs) @ (B, nh, hs, T) -> (B, nh, T, T): query i's score for key j
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_size)
        probs = self.dropout(torch.softmax(scores + additive_mask, dim=-1))  # (B, nh, T, T), rows sum to 1
        # (B, nh, T, T) @ (B, nh, T, hs) -> (B, nh, T, hs) -> (B, T, nh, hs)
        context = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        return context.view(context.shape[0], context.shape[1], -1)  # heads side by side again: (B, T, C)


class BertSelfOutput(nn.Module):
    """Projection, dropout, residual, then LayerNorm (post-LN)."""

    def __init__(self, config: BertConfig, in_size: int):
        super().__init__()
        self.dense = nn.Linear(in_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, x: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config, config.hidden_size)

    def forward(self, x: Tensor, additive_mask: Tensor) -> Tensor:
        return self.output(self.self(x, additive_mask), x)


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = activation(config.hidden_act)

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertSelfOutput(config, config.intermediate_size)

    def forward(self, x: Tensor, additive_mask: Tensor) -> Tensor:
        x = self.attention(x, additive_mask)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, x: Tensor, additive_mask: Tensor) -> Tensor:
        for layer in self.layer:
            x = layer(x, additive_mask)
        return x


class BertPooler(nn.Module):
    """tanh(W · h_[CLS] + b): the sentence vector the classification heads read."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden: Tensor) -> Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))


# --------------------------------------------------------------------------- base class


class BertPreTrainedModel(nn.Module):
    """Weight init plus `from_pretrained` / `save_pretrained` (see checkpoint.py)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config

    def init_weights(self) -> None:
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=std)
                if module.padding_idx is not None:
                    module.weight.data[module.padding_idx].zero_()
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                if module.bias is not None:  # ModernBERT's norms have none
                    nn.init.zeros_(module.bias)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Overridden by heads whose decoder shares the word embeddings."""

    @classmethod
    def from_pretrained(cls, directory: str | Path, **config_overrides):
        from .checkpoint import load_pretrained

        return load_pretrained(cls, directory, **config_overrides)

    def save_pretrained(self, directory: str | Path, tokenizer_from: str | Path | None = None):
        from .checkpoint import save_pretrained

        save_pretrained(self, directory, tokenizer_from=tokenizer_from)


def additive_attention_mask(attention_mask: Tensor, dtype: torch.dtype) -> Tensor:
    """1 = token / 0 = padding  ->  0 / large negative, broadcast over heads and queries."""
    mask = attention_mask[:, None, None, :].to(dtype)  # (B, T) -> (B, 1, 1, T)
    return (1.0 - mask) * torch.finfo(dtype).min


class BertModel(BertPreTrainedModel):
    """The encoder of every architecture in model/architectures.py (MPNet and ModernBERT aside)."""

    def __init__(self, config: BertConfig, add_pooler: bool = True):
        super().__init__(config)
        self.embeddings = BertEmbeddings(config)
        if config.embedding_size not in (None, config.hidden_size):
            # ELECTRA: embedding_size -> hidden_size before the first layer
            self.embeddings_project = nn.Linear(config.embedding_size, config.hidden_size)
        self.encoder = BertEncoder(config)
        # ELECTRA and DistilBERT have no pooler: their heads read the first token themselves.
        has_pooler = add_pooler and architecture(config.model_type).pooler
        self.pooler = BertPooler(config) if has_pooler else None
        self.init_weights()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> EncoderOutput:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.embeddings(input_ids, token_type_ids)
        if hasattr(self, "embeddings_project"):
            x = self.embeddings_project(x)  # (B, T, E) -> (B, T, C)
        x = self.encoder(x, additive_attention_mask(attention_mask, x.dtype))
        pooled = self.pooler(x) if self.pooler is not None else x[:, 0]
        return EncoderOutput(last_hidden_state=x, pooler_output=pooled)


# --------------------------------------------------------------------------- task heads


class BertForSequenceClassification(BertPreTrainedModel):
    """Single text or text pair; `num_labels == 1` is regression with MSE."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.pooling = config.classifier_pooling or "cls"
        if self.pooling not in ("cls", "mean"):
            raise ValueError(f"classifier_pooling must be cls or mean, got {self.pooling!r}")
        self.bert = BertModel(config, add_pooler=self.pooling == "cls")
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        out = self.bert(input_ids, attention_mask, token_type_ids)
        if self.pooling == "mean":
            mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
            pooled = pool(out.last_hidden_state, mask, "mean")  # (B, T, C) -> (B, C)
        else:
            pooled = out.pooler_output
        logits = self.classifier(self.dropout(pooled))
        return HeadOutput(logits=logits, loss=sequence_loss(logits, labels))


def sequence_loss(logits: Tensor, labels: Tensor | None) -> Tensor | None:
    """MSE for one output (regression), else cross-entropy: every sequence classifier's loss."""
    if labels is None:
        return None
    if logits.shape[-1] == 1:
        return F.mse_loss(logits.squeeze(-1), labels.to(logits.dtype))
    return F.cross_entropy(logits, labels)


class BertForTokenClassification(BertPreTrainedModel):
    """One label per token; the loss ignores -100 and padding positions."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.bert = BertModel(config, add_pooler=False)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        hidden = self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state
        logits = self.classifier(self.dropout(hidden))
        loss = None
        if labels is not None:
            if attention_mask is not None:
                labels = labels.masked_fill(attention_mask == 0, -100)
            # flatten tokens: logits (B, T, labels) -> (B * T, labels), labels (B, T) -> (B * T)
            loss = F.cross_entropy(logits.view(-1, self.num_labels), labels.view(-1), ignore_index=-100)
        return HeadOutput(logits=logits, loss=loss)


class BertForMultipleChoice(BertPreTrainedModel):
    """Inputs [batch, choices, seq]; one score per choice, softmax across choices."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        batch, choices, seq = input_ids.shape
        pooled = self.bert(*flat_choices(input_ids, attention_mask, token_type_ids)).pooler_output
        logits = self.classifier(self.dropout(pooled)).view(batch, choices)  # (B * n, 1) -> (B, n)
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return HeadOutput(logits=logits, loss=loss)


def flat_choices(*tensors: Tensor | None) -> list[Tensor | None]:
    """Multiple choice: every choice becomes its own row, (B, n, T) -> (B * n, T)."""
    return [None if t is None else t.reshape(-1, t.shape[-1]) for t in tensors]


class BertForQuestionAnswering(BertPreTrainedModel):
    """Span start/end logits; gold positions outside the sequence are ignored."""

    def __init__(self, config: BertConfig):
        if config.num_labels != 2:  # transformers sizes qa_outputs by num_labels
            config.num_labels = 2
        super().__init__(config)
        self.bert = BertModel(config, add_pooler=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.init_weights()

    def forward(
        self,
        input_ids,
        attention_mask=None,
        token_type_ids=None,
        start_positions=None,
        end_positions=None,
    ):
        hidden = self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state
        start_logits, end_logits = self.qa_outputs(hidden).unbind(dim=-1)
        loss = None
        if start_positions is not None and end_positions is not None:
            ignored = start_logits.shape[1]
            start = start_positions.clamp(0, ignored)
            end = end_positions.clamp(0, ignored)
            loss = (
                F.cross_entropy(start_logits, start, ignore_index=ignored)
                + F.cross_entropy(end_logits, end, ignore_index=ignored)
            ) / 2
        return HeadOutput(start_logits=start_logits, end_logits=end_logits, loss=loss)


def pool(hidden: Tensor, attention_mask: Tensor, mode: str) -> Tensor:
    """(B, T, C) token states -> (B, C), over each row's real tokens, as sentence-transformers'
    Pooling: the mean, the first ([CLS]) token, the per-channel maximum, or the last token."""
    if mode == "cls":
        return hidden[:, 0]
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T) -> (B, T, 1)
    if mode == "mean":
        return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
    if mode == "max":
        return hidden.masked_fill(mask == 0, torch.finfo(hidden.dtype).min).max(dim=1).values
    if mode == "lasttoken":  # right padding: the last real token of row b is at length_b - 1
        last = attention_mask.sum(dim=1) - 1  # (B,)
        return hidden[torch.arange(hidden.shape[0]), last]
    raise ValueError(f"pooling must be one of {POOLING_MODES}, got {mode!r}")


class BertForSentenceEmbedding(BertPreTrainedModel):
    """The encoder with sentence-transformers' pooling on top (config.pooling, default mean). The
    embeddings (B, C) are not normalized. The exported graph returns the token states only:
    serving pools them (processing/embed.py), which the registry's note explains."""

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.pooling = self.pooling_mode(config)
        self.bert = BertModel(config, add_pooler=False)  # the tanh pooler is not part of an embedding
        self.init_weights()

    @staticmethod
    def pooling_mode(config: BertConfig) -> str:
        mode = config.pooling or "mean"
        if mode not in POOLING_MODES:
            raise ValueError(f"pooling must be one of {POOLING_MODES}, got {mode!r}")
        return mode

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        hidden = self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state
        return HeadOutput(embeddings=pool(hidden, attention_mask, self.pooling), last_hidden_state=hidden)


# --------------------------------------------------------------------------- pretraining


class BertLMPredictionHead(nn.Module):
    """dense -> act -> LayerNorm -> decoder tied to the word embeddings (+ own bias)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.transform = nn.Module()
        self.transform.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.transform.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.act = activation(config.hidden_act)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden: Tensor) -> Tensor:
        x = self.transform.LayerNorm(self.act(self.transform.dense(hidden)))
        return self.decoder(x) + self.bias


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig, mlm: bool = True, nsp: bool = True):
        super().__init__()
        if mlm:
            self.predictions = BertLMPredictionHead(config)
        if nsp:
            self.seq_relationship = nn.Linear(config.hidden_size, 2)


def mlm_loss(logits: Tensor, labels: Tensor) -> Tensor:
    # flatten tokens: logits (B, T, vocab) -> (B * T, vocab), labels (B, T) -> (B * T)
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100)


class BertForPreTraining(BertPreTrainedModel):
    """Masked LM + next-sentence prediction; the loss is their sum.

    `masked_only` (pretraining sets it): given labels, the MLM head runs at the masked positions
    only, as the loss needs, and prediction_logits is [masked, vocab] in row-major order. With a
    20,000-piece vocabulary the decoder over every position was most of a step's time."""

    masked_only = False

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config)
        self.init_weights()

    def tie_weights(self) -> None:
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    def forward(
        self, input_ids, attention_mask=None, token_type_ids=None, labels=None, next_sentence_label=None
    ):
        out = self.bert(input_ids, attention_mask, token_type_ids)
        hidden = out.last_hidden_state
        if self.masked_only and labels is not None:
            selected = labels != -100
            hidden, labels = hidden[selected], labels[selected]  # (B, T, H) -> (masked, H); (masked,)
        prediction_logits = self.cls.predictions(hidden)
        nsp_logits = self.cls.seq_relationship(out.pooler_output)
        result = HeadOutput(prediction_logits=prediction_logits, seq_relationship_logits=nsp_logits)
        if labels is not None:
            result.mlm_loss = mlm_loss(prediction_logits, labels)
        if next_sentence_label is not None:
            result.nsp_loss = F.cross_entropy(nsp_logits, next_sentence_label.view(-1))
        if result.mlm_loss is not None and result.nsp_loss is not None:
            result.loss = result.mlm_loss + result.nsp_loss
        return result


class BertForMaskedLM(BertPreTrainedModel):
    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config, add_pooler=False)
        self.cls = BertPreTrainingHeads(config, nsp=False)
        self.init_weights()

    def tie_weights(self) -> None:
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight

    def mlm_logits(self, input_ids, attention_mask=None, token_type_ids=None) -> Tensor:
        hidden = self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state
        return self.cls.predictions(hidden)  # (B, T, vocab)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        logits = self.mlm_logits(input_ids, attention_mask, token_type_ids)
        loss = mlm_loss(logits, labels) if labels is not None else None
        return HeadOutput(logits=logits, loss=loss)


def splade(logits: Tensor, attention_mask: Tensor) -> Tensor:
    """SPLADE's term weights: (B, T, vocab) MLM logits -> (B, vocab), the maximum over each row's
    real tokens of log(1 + relu(logit)). Every weight is >= 0, so zeroing padding masks it exactly."""
    weights = torch.log1p(torch.relu(logits))  # (B, T, vocab)
    mask = attention_mask.unsqueeze(-1).to(weights.dtype)  # (B, T) -> (B, T, 1)
    return (weights * mask).max(dim=1).values  # (B, vocab)


class BertForSparseEmbedding(BertForMaskedLM):
    """The masked-LM head reduced by SPLADE inside the graph: a (B, vocab) answer instead of the
    (B, T, vocab) logits, which at 30k words would be 120 kB a token."""

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        return HeadOutput(
            sparse=splade(self.mlm_logits(input_ids, attention_mask, token_type_ids), attention_mask)
        )


class BertForNextSentencePrediction(BertPreTrainedModel):
    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config, mlm=False)
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        pooled = self.bert(input_ids, attention_mask, token_type_ids).pooler_output
        logits = self.cls.seq_relationship(pooled)
        loss = F.cross_entropy(logits, labels.view(-1)) if labels is not None else None
        return HeadOutput(logits=logits, loss=loss)


# Each served task's head is named by the task registry (processing.tasks); pretraining is ours only.
TASK_HEADS: dict[str, type[BertPreTrainedModel]] = {
    **{name: globals()[spec.head] for name, spec in TASKS.items()},
    "pretrain": BertForPreTraining,
}
