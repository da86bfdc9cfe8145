"""MPNet from scratch: BERT's post-LN layer, plus a learned relative-position bias in attention.

What differs from model/bert.py, each in one place below:
- positions start after the padding index (1) and skip padding tokens, as RoBERTa's;
- no token types (the graph still takes token_type_ids, and ignores them);
- one table of relative-position buckets x heads, shared by every layer, added to the scores;
- weight names: `attention.attn.{q,k,v,o}`, `attention.LayerNorm`, `encoder.relative_attention_bias`,
  base prefix `mpnet.`;
- the sequence classification head is RoBERTa's (dense, tanh, out_proj on <s>), without the pooler.
Parameter names follow `transformers`' MPNet so checkpoints load by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from processing.tasks import TASKS

from .bert import (
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSentenceEmbedding,
    BertForSparseEmbedding,
    BertForTokenClassification,
    BertIntermediate,
    BertPooler,
    BertPreTrainedModel,
    BertSelfOutput,
    EncoderOutput,
    HeadOutput,
    additive_attention_mask,
    mlm_loss,
    sequence_loss,
)
from .config import BertConfig
from .roberta import RobertaClassificationHead, RobertaLMHead

# transformers' MPNetEncoder.compute_position_bias always buckets into 32, whatever the config's
# relative_attention_num_buckets (which only sizes the table); we do the same.
NUM_BUCKETS = 32
MAX_DISTANCE = 128


@dataclass
class MPNetConfig(BertConfig):
    MODEL_TYPE: ClassVar[str] = "mpnet"
    POSITION_OFFSET: ClassVar[int] = 2  # positions start at padding_idx + 1 = 2
    relative_attention_num_buckets: int = 32
    pad_token_id: int = 1
    layer_norm_eps: float = 1e-5


def position_ids_from_input_ids(input_ids: Tensor, padding_idx: int) -> Tensor:
    """1, 2, ... after the padding index for real tokens, padding_idx for padding (fairseq's rule)."""
    real = input_ids.ne(padding_idx).int()  # (B, T)
    return (torch.cumsum(real, dim=1) * real).long() + padding_idx  # (B, T)


def relative_position_bucket(
    relative: Tensor, num_buckets: int = NUM_BUCKETS, max_distance: int = MAX_DISTANCE
):
    """T5-style buckets: half for keys before the query, half after; exact up to a quarter of the
    buckets, then logarithmic up to max_distance."""
    n = -relative
    half = num_buckets // 2
    bucket = (n < 0).long() * half  # keys after the query use the upper half
    n = n.abs()
    exact = half // 2
    log_scaled = (
        exact + (torch.log(n.float() / exact) / math.log(max_distance / exact) * (half - exact)).long()
    )
    log_scaled = torch.clamp(log_scaled, max=half - 1)
    return bucket + torch.where(n < exact, n, log_scaled)


class MPNetEmbeddings(nn.Module):
    """word + learned position (no segments), then LayerNorm and dropout."""

    padding_idx = 1  # transformers hard-codes it, whatever pad_token_id says

    def __init__(self, config: BertConfig):
        super().__init__()
        h = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, h, padding_idx=self.padding_idx)
        self.position_embeddings = nn.Embedding(
            config.max_position_embeddings, h, padding_idx=self.padding_idx
        )
        self.LayerNorm = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: Tensor) -> Tensor:
        positions = position_ids_from_input_ids(input_ids, self.padding_idx)
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        return self.dropout(self.LayerNorm(x))


class MPNetSelfAttention(nn.Module):
    """BERT's attention with the relative-position bias added to the scores, and its own output
    projection `o` (the residual and LayerNorm sit one level up, in MPNetAttention)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        h = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_size = h // self.num_heads
        self.q, self.k, self.v, self.o = (nn.Linear(h, h) for _ in range(4))
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

    def split_heads(self, x: Tensor) -> Tensor:
        x = x.view(x.shape[0], x.shape[1], self.num_heads, self.head_size)  # (B, T, C) -> (B, T, nh, hs)
        return x.permute(0, 2, 1, 3)  # (B, nh, T, hs)

    def forward(self, x: Tensor, additive_mask: Tensor, position_bias: Tensor) -> Tensor:
        q, k, v = self.split_heads(self.q(x)), self.split_heads(self.k(x)), self.split_heads(self.v(x))
        # (B, nh, T, hs) @ (B, nh, hs, T) -> (B, nh, T, T), plus the (1, nh, T, T) bias
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_size) + position_bias
        probs = self.dropout(torch.softmax(scores + additive_mask, dim=-1))
        context = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()  # (B, nh, T, hs) -> (B, T, nh, hs)
        return self.o(context.view(context.shape[0], context.shape[1], -1))  # (B, T, C)


class MPNetAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.attn = MPNetSelfAttention(config)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, x: Tensor, additive_mask: Tensor, position_bias: Tensor) -> Tensor:
        return self.LayerNorm(self.dropout(self.attn(x, additive_mask, position_bias)) + x)


class MPNetLayer(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = MPNetAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertSelfOutput(config, config.intermediate_size)

    def forward(self, x: Tensor, additive_mask: Tensor, position_bias: Tensor) -> Tensor:
        x = self.attention(x, additive_mask, position_bias)
        return self.output(self.intermediate(x), x)


class MPNetEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(MPNetLayer(config) for _ in range(config.num_hidden_layers))
        # One learned scalar per (bucket, head), shared by all layers.
        buckets = getattr(config, "relative_attention_num_buckets", NUM_BUCKETS)
        self.relative_attention_bias = nn.Embedding(buckets, config.num_attention_heads)

    def position_bias(self, seq: int, device: torch.device) -> Tensor:
        position = torch.arange(seq, device=device)
        relative = position[None, :] - position[:, None]  # (T, T): key position minus query position
        values = self.relative_attention_bias(relative_position_bucket(relative))  # (T, T, nh)
        return values.permute(2, 0, 1).unsqueeze(0)  # (T, T, nh) -> (1, nh, T, T)

    def forward(self, x: Tensor, additive_mask: Tensor) -> Tensor:
        bias = self.position_bias(x.shape[1], x.device)
        for layer in self.layer:
            x = layer(x, additive_mask, bias)
        return x


class MPNetPreTrainedModel(BertPreTrainedModel):
    config_class = MPNetConfig
    base_model_prefix = "mpnet"
    tied_keys = ("lm_head.decoder.weight",)
    # transformers ties lm_head.decoder.bias to lm_head.bias; older checkpoints save both.
    ignored_unexpected = ("pooler.", "lm_head.decoder.bias", "position_ids")

    @property
    def bert(self) -> MPNetModel:
        """The encoder, under the name BERT's head code (whose forward these heads reuse) calls it."""
        return self.mpnet


class MPNetModel(MPNetPreTrainedModel):
    def __init__(self, config: BertConfig, add_pooler: bool = True):
        super().__init__(config)
        self.embeddings = MPNetEmbeddings(config)
        self.encoder = MPNetEncoder(config)
        self.pooler = BertPooler(config) if add_pooler else None
        self.init_weights()

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids=None
    ) -> EncoderOutput:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        x = self.embeddings(input_ids)
        x = self.encoder(x, additive_attention_mask(attention_mask, x.dtype))
        pooled = self.pooler(x) if self.pooler is not None else x[:, 0]
        return EncoderOutput(last_hidden_state=x, pooler_output=pooled)


# The heads. Token classification, multiple choice, QA, sentence and sparse embeddings reuse BERT's
# forward on MPNet's encoder (`self.bert` is `self.mpnet`); sequence classification has its own head.


class MPNetForSequenceClassification(MPNetPreTrainedModel):
    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.mpnet = MPNetModel(config, add_pooler=False)
        self.classifier = RobertaClassificationHead(config)  # RoBERTa's: dense, tanh, out_proj on <s>
        self.init_weights()

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        logits = self.classifier(self.mpnet(input_ids, attention_mask).last_hidden_state)
        return HeadOutput(logits=logits, loss=sequence_loss(logits, labels))


class MPNetForMaskedLM(MPNetPreTrainedModel):
    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.mpnet = MPNetModel(config, add_pooler=False)
        self.lm_head = RobertaLMHead(config)  # RoBERTa's: dense, gelu, layer_norm, tied decoder
        self.init_weights()

    def tie_weights(self) -> None:
        self.lm_head.decoder.weight = self.mpnet.embeddings.word_embeddings.weight

    def mlm_logits(self, input_ids, attention_mask=None, token_type_ids=None) -> Tensor:
        return self.lm_head(self.mpnet(input_ids, attention_mask).last_hidden_state)  # (B, T, vocab)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        logits = self.mlm_logits(input_ids, attention_mask)
        return HeadOutput(logits=logits, loss=mlm_loss(logits, labels) if labels is not None else None)


class MPNetForSparseEmbedding(MPNetForMaskedLM):
    """SPLADE on the masked-LM head (model.bert.splade)."""

    forward = BertForSparseEmbedding.forward


class MPNetForTokenClassification(MPNetPreTrainedModel):
    forward = BertForTokenClassification.forward

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.mpnet = MPNetModel(config, add_pooler=False)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights()


class MPNetForMultipleChoice(MPNetPreTrainedModel):
    """BERT's: the tanh pooler on <s>, then one score per choice."""

    forward = BertForMultipleChoice.forward

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.mpnet = MPNetModel(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.init_weights()


class MPNetForQuestionAnswering(MPNetPreTrainedModel):
    forward = BertForQuestionAnswering.forward

    def __init__(self, config: BertConfig):
        config.num_labels = 2  # transformers sizes qa_outputs by num_labels
        super().__init__(config)
        self.mpnet = MPNetModel(config, add_pooler=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.init_weights()


class MPNetForSentenceEmbedding(MPNetPreTrainedModel):
    forward = BertForSentenceEmbedding.forward

    def __init__(self, config: BertConfig):
        super().__init__(config)
        self.pooling = BertForSentenceEmbedding.pooling_mode(config)
        self.mpnet = MPNetModel(config, add_pooler=False)
        self.init_weights()


TASK_HEADS: dict[str, type[MPNetPreTrainedModel]] = {
    name: globals()[spec.head.replace("Bert", "MPNet")] for name, spec in TASKS.items()
}
TASK_HEADS["mlm"] = MPNetForMaskedLM
