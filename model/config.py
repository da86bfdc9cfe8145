"""BertConfig: the Hugging Face `config.json` format, plus task metadata.

Torch-free on purpose, so the export manifest and tools can read configs cheaply.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

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
    id2label: dict[int, str] | None = None
    # Project metadata: which head this checkpoint is for ("classify", "ner", ...).
    task: str | None = None
    problem_type: str | None = None
    # Sentence embeddings (task "embed"): how token states pool into one vector, mean | cls | max.
    pooling: str | None = None
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

    @property
    def max_positions(self) -> int:
        """The longest sequence the position table serves: fewer than its rows where positions start
        past the padding index (MPNetConfig.POSITION_OFFSET)."""
        return self.max_position_embeddings - self.POSITION_OFFSET

    @property
    def num_labels(self) -> int:
        return len(self.id2label) if self.id2label else 2

    @num_labels.setter
    def num_labels(self, n: int) -> None:
        self.id2label = {i: f"LABEL_{i}" for i in range(n)}

    @property
    def label2id(self) -> dict[str, int]:
        return {v: k for k, v in (self.id2label or {}).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BertConfig:
        known = {f.name for f in fields(cls)} - {"extra"}
        data = dict(data)
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
        out.setdefault("model_type", self.MODEL_TYPE)
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
