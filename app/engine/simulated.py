"""A simulated accelerator (DEVICE=simulated): each batch takes SIMULATED_BATCH_MS of wall time per
MAX_BATCH_SIZE rows and no CPU, as a GPU's kernels do, and answers zeros of the model's output
shapes. It measures everything but the model (HTTP, tokenizing, batching, the engine boundary) on
a small machine. For benchmarks and tests only: never a default, and its answers mean nothing."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from export.bundle import BundleManifest
from processing.tasks import TASKS


class SimulatedRuntime:
    def __init__(
        self,
        manifest: BundleManifest,
        batch_ms: float,
        batch_size: int,
        sleep: Callable[[float], None] = time.sleep,
        vocab: int = 1,
    ):
        self.spec = TASKS[manifest.task]
        self.labels = len(manifest.labels or []) or 1
        shapes = {o["name"]: o["shape"] for o in manifest.outputs}
        self.hidden = int(shapes.get("last_hidden_state", [1])[-1])
        self.vocab = vocab  # a sparse model's axis: the tokenizer's size (symbolic in the manifest)
        self.batch_s = batch_ms / 1000.0
        self.batch_size = batch_size
        self.batches = 0
        self.sleep = sleep

    provider = "simulated"
    providers = ["simulated"]
    threads = 0  # it uses none

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids = inputs["input_ids"]  # [batch, seq] or [batch, choices, seq]
        rows = math.prod(ids.shape[:-1])
        self.sleep(self.batch_s * math.ceil(rows / self.batch_size))  # the device's time, not the CPU's
        self.batches += 1
        sizes = dict(zip(self.spec.token_axes, ids.shape, strict=True))
        sizes.update(labels=self.labels, hidden=self.hidden, vocab=self.vocab)
        return {
            name: np.zeros([sizes[axis] for axis in axes], dtype=np.float32)
            for name, axes in self.spec.outputs
        }
