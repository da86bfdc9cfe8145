"""An ONNX Runtime session shaped like one of our heads, so the trainer's evaluation loop can score
an exported bundle exactly as it scores a checkpoint."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from export.verify import make_session
from model.bert import HeadOutput


class OrtHead(torch.nn.Module):
    def __init__(self, onnx_path: Path, threads: int, disabled_optimizers: list[str]):
        super().__init__()
        self.session = make_session(onnx_path, threads, disabled_optimizers)
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.placeholder = torch.nn.Parameter(torch.zeros(1))  # the trainer builds an optimizer

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, **_labels) -> HeadOutput:
        given = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        feeds = {name: given[name].numpy().astype(np.int64) for name in self.inputs}
        result = dict(zip(self.outputs, self.session.run(None, feeds), strict=True))
        return HeadOutput(
            **{name: torch.from_numpy(np.asarray(v, dtype=np.float32)) for name, v in result.items()}
        )
