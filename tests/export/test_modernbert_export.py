"""ModernBERT checkpoints saved by `transformers` export with every variant and match it, per head."""

from __future__ import annotations

import numpy as np
import pytest

from export.__main__ import main
from export.bundle import load_bundle_manifest
from export.pipeline import VARIANTS
from tests.helpers.encoders import hf_modernbert, save_with_wordpiece

from .test_mpnet_export import reference, run

transformers = pytest.importorskip("transformers")

HEADS = {
    "classify": "ModernBertForSequenceClassification",
    "ner": "ModernBertForTokenClassification",
    "multiple-choice": "ModernBertForMultipleChoice",
    "qa": "ModernBertForQuestionAnswering",
    "embed": "ModernBertModel",
}


def feeds_for(task: str, seed: int = 7) -> dict[str, np.ndarray]:
    """Right-padded rows up to 40 tokens: beyond the local window of 16."""
    rng = np.random.default_rng(seed)
    shape = (2, 3, 40) if task == "multiple-choice" else (4, 40)
    lengths = rng.integers(3, 41, size=shape[:-1])
    lengths.flat[0] = 40
    mask = (np.arange(40) < lengths[..., None]).astype(np.int64)
    ids = (rng.integers(5, 90, size=shape) * mask).astype(np.int64)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


@pytest.mark.parametrize("task", list(HEADS))
def test_a_modernbert_checkpoint_exports_every_variant_and_matches_transformers(task, tmp_path):
    model = hf_modernbert(HEADS[task], num_labels={"ner": 9}.get(task, 2))
    checkpoint = save_with_wordpiece(model, tmp_path / "checkpoint")
    assert main([str(checkpoint), str(tmp_path / "b"), "--max-seq-len", "64", "--quiet"]) == 0
    manifest = load_bundle_manifest(tmp_path / "b")
    assert manifest.task == task and set(manifest.variants) == set(VARIANTS)
    assert all(report.get("passed") is not False for report in manifest.verification.values())
    feeds = feeds_for(task)
    ref = reference(model, task, feeds)
    real = feeds["attention_mask"].astype(bool)
    for variant, tolerance in (("fp32", 1e-5), ("fused", 1e-4)):
        got = run(tmp_path / "b", variant, feeds)
        for name, expected in ref.items():
            a, b = got[name], expected
            if task in ("ner", "qa", "embed"):
                a, b = a[real], b[real]
            assert np.abs(a - b).max() <= tolerance, (variant, name, np.abs(a - b).max())
