"""ModernBERT from scratch: a pre-norm encoder with rotary positions, GeGLU and local/global attention.

What differs from model/bert.py:
- no position table: rotary positions rotate queries and keys, with a base (theta) per layer kind,
  160k for global layers and 10k for local ones;
- every `global_attn_every_n_layers`-th layer (0, 3, 6 ...) attends globally, the others within a
  sliding window of `local_attention` tokens (|i - j| <= local_attention / 2);
- pre-norm layers (layer 0 has no attention norm: the embedding norm precedes it), a final norm;
- GeGLU MLP: Wi gives input and gate, act(input) * gate, then Wo;
- no biases (attention, MLP, norms) unless the config asks for them;
- the heads run `head` (dense, activation, norm) first; classification pools CLS or the mean.
Unpadding (flash-attention's varlen path) is not done: the exported graph runs padded batches, which
the batcher keeps near one length on CPU; unpadding would need data-dependent gathers that neither
the tracer nor ONNX Runtime's fusions handle well, and it changes no number.
Parameter names follow `transformers`' ModernBERT so checkpoints load by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from processing.tasks import TASKS

from .bert import (
    ACTIVATIONS,
    BertForSentenceEmbedding,
    BertForSparseEmbedding,
    BertPreTrainedModel,
    EncoderOutput,
    HeadOutput,
    mlm_loss,
)
from .config import BertConfig

GLOBAL, LOCAL = "full_attention", "sliding_attention"


@dataclass
class ModernBertConfig(BertConfig):
    MODEL_TYPE: ClassVar[str] = "modernbert"
    vocab_size: int = 50368
    intermediate_size: int = 1152
    num_hidden_layers: int = 22
    max_position_embeddings: int = 8192
    pad_token_id: int = 50283
    hidden_activation: str = "gelu"
    norm_eps: float = 1e-5
    norm_bias: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    decoder_bias: bool = True
    classifier_pooling: str = "cls"  # cls | mean
    classifier_bias: bool = False
    classifier_activation: str = "gelu"
    local_attention: int = 128  # the whole window; each side sees half of it
    global_attn_every_n_layers: int = 3
    global_rope_theta: float = 160_000.0
    local_rope_theta: float = 10_000.0
    layer_types: list[str] | None = None
    rope_parameters: dict[str, Any] | None = field(default=None)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.layer_types is None:  # older configs name the period only
            every = self.global_attn_every_n_layers
            self.layer_types = [LOCAL if i % every else GLOBAL for i in range(self.num_hidden_layers)]
        if len(self.layer_types) != self.num_hidden_layers or set(self.layer_types) - {GLOBAL, LOCAL}:
            raise ValueError(f"layer_types {self.layer_types} must name {GLOBAL} or {LOCAL} for every layer")
        for kind, params in (self.rope_parameters or {}).items():
            if params and params.get("rope_type", "default") != "default":
                raise ValueError(f"rope_type {params['rope_type']!r} ({kind}) is not supported; only default")

    def rope_theta(self, kind: str) -> float:
        params = (self.rope_parameters or {}).get(kind) or {}
        fallback = self.global_rope_theta if kind == GLOBAL else self.local_rope_theta
        return float(params.get("rope_theta", fallback))


def layer_norm(config: ModernBertConfig) -> nn.LayerNorm:
    return nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # (x1, x2) -> (-x2, x1)


class Rotary(nn.Module):
    """cos and sin of position * frequency, for one base (theta)."""

    def __init__(self, head_size: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_size, 2, dtype=torch.float) / head_size))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, seq: int, device: torch.device) -> tuple[Tensor, Tensor]:
        freqs = torch.arange(seq, device=device, dtype=torch.float)[:, None] * self.inv_freq  # (T, hs/2)
        angles = torch.cat((freqs, freqs), dim=-1)  # (T, hs): each frequency for both halves
        return angles.cos(), angles.sin()


class ModernBertEmbeddings(nn.Module):
    """Token embeddings, norm, dropout: no positions (rotary) and no segments."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.tok_embeddings = nn.Embedding(
            config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id
        )
        self.norm = layer_norm(config)
        self.drop = nn.Dropout(config.extra.get("embedding_dropout", 0.0))

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.drop(self.norm(self.tok_embeddings(input_ids)))


class ModernBertAttention(nn.Module):
    def __init__(self, config: ModernBertConfig):
        super().__init__()
        h = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_size = h // self.num_heads
        self.Wqkv = nn.Linear(h, 3 * h, bias=config.attention_bias)
        self.Wo = nn.Linear(h, h, bias=config.attention_bias)

    def forward(self, x: Tensor, additive_mask: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        B, T, C = x.shape
        qkv = self.Wqkv(x).view(B, T, 3, self.num_heads, self.head_size)  # (B, T, 3C) -> (B, T, 3, nh, hs)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, nh, T, hs)
        q = q * cos + rotate_half(q) * sin  # (T, hs) broadcast over batch and heads
        k = k * cos + rotate_half(k) * sin
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_size)  # (B, nh, T, T)
        probs = torch.softmax(scores + additive_mask, dim=-1)
        context = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()  # (B, nh, T, hs) -> (B, T, nh, hs)
        return self.Wo(context.view(B, T, C))  # heads side by side: (B, T, C)


class ModernBertMLP(nn.Module):
    """GeGLU: Wi gives (input, gate) side by side; act(input) * gate; Wo back to the hidden size."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.Wi = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.act = ACTIVATIONS[config.hidden_activation]
        self.Wo = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: Tensor) -> Tensor:
        value, gate = self.Wi(x).chunk(2, dim=-1)  # (B, T, 2I) -> 2 x (B, T, I)
        return self.Wo(self.act(value) * gate)


class ModernBertEncoderLayer(nn.Module):
    """Pre-norm: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: ModernBertConfig, index: int):
        super().__init__()
        # Layer 0 reads the embedding norm's output directly.
        self.attn_norm = nn.Identity() if index == 0 else layer_norm(config)
        self.attn = ModernBertAttention(config)
        self.mlp_norm = layer_norm(config)
        self.mlp = ModernBertMLP(config)
        self.kind = config.layer_types[index]

    def forward(self, x: Tensor, additive_mask: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        x = x + self.attn(self.attn_norm(x), additive_mask, cos, sin)
        return x + self.mlp(self.mlp_norm(x))


def attention_masks(attention_mask: Tensor, window: int, dtype: torch.dtype) -> dict[str, Tensor]:
    """Additive masks per layer kind: global layers see every real token; local ones only the real
    tokens within `window` positions on either side."""
    T = attention_mask.shape[1]
    neg = torch.finfo(dtype).min
    padding = (1.0 - attention_mask[:, None, None, :].to(dtype)) * neg  # (B, T) -> (B, 1, 1, T)
    position = torch.arange(T, device=attention_mask.device)
    far = (position[None, :] - position[:, None]).abs() > window  # (T, T): key j too far from query i
    local = padding.masked_fill(far[None, None], neg)  # (B, 1, T, T)
    return {GLOBAL: padding, LOCAL: local}


class ModernBertPreTrainedModel(BertPreTrainedModel):
    config_class = ModernBertConfig
    base_model_prefix = "model"
    encoder_roots = ("embeddings", "layers", "final_norm")
    tied_keys = ("decoder.weight",)
    ignored_unexpected = ("inv_freq",)

    @property
    def bert(self) -> ModernBertModel:
        """The encoder, under the name BERT's head code (reused by the embedding heads) calls it."""
        return self.model


class ModernBertModel(ModernBertPreTrainedModel):
    def __init__(self, config: ModernBertConfig):
        super().__init__(config)
        self.embeddings = ModernBertEmbeddings(config)
        self.layers = nn.ModuleList(
            ModernBertEncoderLayer(config, i) for i in range(config.num_hidden_layers)
        )
        self.final_norm = layer_norm(config)
        head_size = config.hidden_size // config.num_attention_heads
        self.rotary = nn.ModuleDict(
            {kind: Rotary(head_size, config.rope_theta(kind)) for kind in (GLOBAL, LOCAL)}
        )
        self.init_weights()

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids=None
    ) -> EncoderOutput:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        x = self.embeddings(input_ids)
        masks = attention_masks(attention_mask, self.config.local_attention // 2, x.dtype)
        rotations = {kind: rotary(x.shape[1], x.device) for kind, rotary in self.rotary.items()}
        for layer in self.layers:
            x = layer(x, masks[layer.kind], *rotations[layer.kind])
        x = self.final_norm(x)
        return EncoderOutput(last_hidden_state=x, pooler_output=x[:, 0])


class ModernBertPredictionHead(nn.Module):
    """dense, activation, norm: what every ModernBERT head runs before its output layer."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.classifier_bias)
        self.act = ACTIVATIONS[config.classifier_activation]
        self.norm = layer_norm(config)
        self.register_buffer("zero_bias", torch.zeros(config.hidden_size), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() == 2 and self.dense.bias is None:
            # A pooled (B, C) vector: with an explicit zero bias the graph holds a Gemm, which the INT8
            # rewrites leave fp32 as they leave BERT's pooler (export.quantize_rowwise shares one
            # zero point across the token rows (B, T, C) it quantizes, and a (B, C) input breaks that).
            return self.norm(self.act(F.linear(x, self.dense.weight, self.zero_bias)))
        return self.norm(self.act(self.dense(x)))


def sentence_vector(hidden: Tensor, attention_mask: Tensor, mode: str, first_real: bool) -> Tensor:
    """(B, T, C) -> (B, C) for the classification heads: the masked mean, or CLS: position 0, or with
    `first_real` the first real token (transformers' multiple-choice head, which allows left padding)."""
    if mode == "mean":
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T) -> (B, T, 1)
        return (hidden * mask).sum(dim=1) / mask.sum(dim=1)
    if not first_real:
        return hidden[:, 0]
    first = attention_mask.argmax(dim=-1)  # (B,): the first real token
    return hidden[torch.arange(hidden.shape[0]), first]


class ModernBertWithHead(ModernBertPreTrainedModel):
    """The encoder, the prediction head and a linear output layer of `outputs` values."""

    def __init__(self, config: ModernBertConfig, outputs: int):
        super().__init__(config)
        self.model = ModernBertModel(config)
        self.head = ModernBertPredictionHead(config)
        self.drop = nn.Dropout(config.extra.get("classifier_dropout", 0.0))
        self.classifier = nn.Linear(config.hidden_size, outputs)
        self.init_weights()

    def scores(
        self, input_ids: Tensor, attention_mask: Tensor | None, pooled: bool, first_real=False
    ) -> Tensor:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        hidden = self.model(input_ids, attention_mask).last_hidden_state
        if pooled:
            hidden = sentence_vector(hidden, attention_mask, self.config.classifier_pooling, first_real)
        return self.classifier(self.drop(self.head(hidden)))


class ModernBertForSequenceClassification(ModernBertWithHead):
    def __init__(self, config: ModernBertConfig):
        super().__init__(config, config.num_labels)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        logits = self.scores(input_ids, attention_mask, pooled=True)
        loss = None
        if labels is not None:
            if self.config.num_labels == 1:
                loss = F.mse_loss(logits.squeeze(-1), labels.to(logits.dtype))
            else:
                loss = F.cross_entropy(logits, labels)
        return HeadOutput(logits=logits, loss=loss)


class ModernBertForTokenClassification(ModernBertWithHead):
    def __init__(self, config: ModernBertConfig):
        super().__init__(config, config.num_labels)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        logits = self.scores(input_ids, attention_mask, pooled=False)
        loss = None
        if labels is not None:
            if attention_mask is not None:
                labels = labels.masked_fill(attention_mask == 0, -100)
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100)
        return HeadOutput(logits=logits, loss=loss)


class ModernBertForQuestionAnswering(ModernBertWithHead):
    def __init__(self, config: ModernBertConfig):
        config.num_labels = 2  # transformers sizes the classifier by num_labels
        super().__init__(config, 2)

    def forward(
        self, input_ids, attention_mask=None, token_type_ids=None, start_positions=None, end_positions=None
    ):
        start_logits, end_logits = self.scores(input_ids, attention_mask, pooled=False).unbind(dim=-1)
        loss = None
        if start_positions is not None and end_positions is not None:
            ignored = start_logits.shape[1]
            start, end = start_positions.clamp(0, ignored), end_positions.clamp(0, ignored)
            loss = (
                F.cross_entropy(start_logits, start, ignore_index=ignored)
                + F.cross_entropy(end_logits, end, ignore_index=ignored)
            ) / 2
        return HeadOutput(start_logits=start_logits, end_logits=end_logits, loss=loss)


class ModernBertForMultipleChoice(ModernBertWithHead):
    def __init__(self, config: ModernBertConfig):
        super().__init__(config, 1)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        batch, choices, seq = input_ids.shape
        mask = None if attention_mask is None else attention_mask.reshape(batch * choices, seq)
        flat_ids = input_ids.reshape(batch * choices, seq)  # (B, n, T) -> (B * n, T)
        flat = self.scores(flat_ids, mask, pooled=True, first_real=True)
        logits = flat.view(batch, choices)  # (B * n, 1) -> (B, n)
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return HeadOutput(logits=logits, loss=loss)


class ModernBertForMaskedLM(ModernBertPreTrainedModel):
    def __init__(self, config: ModernBertConfig):
        super().__init__(config)
        self.model = ModernBertModel(config)
        self.head = ModernBertPredictionHead(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=config.decoder_bias)
        self.init_weights()

    def tie_weights(self) -> None:
        self.decoder.weight = self.model.embeddings.tok_embeddings.weight

    def mlm_logits(self, input_ids, attention_mask=None, token_type_ids=None) -> Tensor:
        return self.decoder(
            self.head(self.model(input_ids, attention_mask).last_hidden_state)
        )  # (B, T, vocab)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None):
        logits = self.mlm_logits(input_ids, attention_mask)
        return HeadOutput(logits=logits, loss=mlm_loss(logits, labels) if labels is not None else None)


class ModernBertForSparseEmbedding(ModernBertForMaskedLM):
    """SPLADE on the masked-LM head (model.bert.splade)."""

    forward = BertForSparseEmbedding.forward


class ModernBertForSentenceEmbedding(ModernBertPreTrainedModel):
    """The final-normed token states, pooled as sentence-transformers' Pooling says."""

    forward = BertForSentenceEmbedding.forward

    def __init__(self, config: ModernBertConfig):
        super().__init__(config)
        self.pooling = BertForSentenceEmbedding.pooling_mode(config)
        self.model = ModernBertModel(config)
        self.init_weights()


TASK_HEADS: dict[str, type[ModernBertPreTrainedModel]] = {
    name: globals()[spec.head.replace("Bert", "ModernBert")] for name, spec in TASKS.items()
}
TASK_HEADS["mlm"] = ModernBertForMaskedLM
