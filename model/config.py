"""BertConfig: the Hugging Face `config.json` format, plus task metadata.

One config for every architecture in model/architectures.py: its `model_type` row renames the keys
an architecture spells otherwise (DistilBERT's `dim`, `n_layers` ...) on read and back on write.
Torch-free on purpose, so the export manifest and tools can read configs cheaply.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from .architectures import ARCHITECTURES

CONFIG_NAME = "config.json"


@dataclass
class BertConfig:
    MODEL_TYPE: ClassVar[str] = "bert"  # config.json's model_type; subclasses for other architectures
    POSITION_OFFSET: ClassVar[int] = 0  # position table rows before the first token's
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0
    model_type: str = "bert"  # the row of model/architectures.py
    embedding_size: int | None = None  # ELECTRA: narrower embeddings, projected to hidden_size
    id2label: dict[int, str] | None = None
    # Project metadata: which head this checkpoint is for ("classify", "ner", ...).
    task: str | None = None
    problem_type: str | None = None
    # Sentence embeddings (task "embed"): how token states pool into one vector, mean | cls | max.
    pooling: str | None = None
    # Sequence classification: the tanh pooler over [CLS] ("cls", BERT's; None) or the masked mean of
    # the token states ("mean", as ModernBERT's key; transformers' BertForSequenceClassification
    # ignores it). Saved with the model, so export and serving pool as training did.
    classifier_pooling: str | None = None
    # Keys we do not model explicitly survive a load/save round trip.
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if self.id2label is not None:
            self.id2label = {int(k): str(v) for k, v in self.id2label.items()}
        if self.model_type == "bert":  # an architecture's own config class (model/mpnet.py) names its row
            self.model_type = self.MODEL_TYPE

    @property
    def num_labels(self) -> int:
        return len(self.id2label) if self.id2label else 2

    @num_labels.setter
    def num_labels(self, n: int) -> None:
        self.id2label = {i: f"LABEL_{i}" for i in range(n)}

    @property
    def max_tokens(self) -> int:
        """The longest input the position table covers: RoBERTa's positions start after the
        padding index, so 514 positions hold 512 tokens."""
        if self.POSITION_OFFSET:  # MPNet: positions start at padding_idx + 1 = 2, whatever its pad id
            return self.max_position_embeddings - self.POSITION_OFFSET
        if ARCHITECTURES.get(self.model_type, ARCHITECTURES["bert"]).positions_skip_padding:
            return self.max_position_embeddings - self.pad_token_id - 1
        return self.max_position_embeddings

    @property
    def label2id(self) -> dict[str, int]:
        return {v: k for k, v in (self.id2label or {}).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BertConfig:
        known = {f.name for f in fields(cls)} - {"extra"}
        data = dict(data)
        arch = ARCHITECTURES.get(data.get("model_type") or "bert")
        if arch is not None:  # an unknown model_type is refused where a model is built (architecture())
            data = {arch.config_names.get(k, k): v for k, v in data.items()}
            data.update(arch.fixed)
        kwargs = {k: data.pop(k) for k in list(data) if k in known}
        num_labels = data.pop("num_labels", None)
        data.pop("label2id", None)  # derived from id2label
        config = cls(**kwargs, extra=data)
        if config.id2label is None and num_labels is not None:
            config.num_labels = int(num_labels)
        return config

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "extra" and v is not None}
        out.update(self.extra)
        arch = ARCHITECTURES.get(self.model_type)
        if arch is not None:
            theirs = {ours: key for key, ours in arch.config_names.items()}
            out = {theirs.get(k, k): v for k, v in out.items() if k not in arch.fixed}
        if self.id2label:
            out["id2label"] = {str(k): v for k, v in self.id2label.items()}
            out["label2id"] = self.label2id
        return out

    @classmethod
    def from_json_file(cls, path: str | Path) -> BertConfig:
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> BertConfig:
        return cls.from_json_file(Path(directory) / CONFIG_NAME)

    def save_pretrained(self, directory: str | Path) -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        with open(Path(directory) / CONFIG_NAME, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=2, sort_keys=True)
            f.write("\n")
