"""Sentence encoders export as `embed` bundles: sentence-transformers folders (laid out as on the
hub: modules.json, 1_Pooling/config.json, an optional Normalize) and plain BertModel checkpoints.
The bundle's token states, pooled as serving pools them (processing.embed), match the
sentence-transformers package on the same folder, and `transformers`' BertModel."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from export.__main__ import main
from export.bundle import load_bundle_manifest
from export.pipeline import ExportError, export_bundle
from export.verify import make_session
from processing.embed import normalize, pool_tokens
from processing.padding import pad_batch
from processing.tokenizer import TextTokenizer

from .test_transformers_checkpoints import hf_model, save_with_tokenizer

SENTENCES = [
    "the cat sat on the mat",
    "john lives in paris",
    "a great movie",
    "where was mary born ? she was born in berlin , the capital of germany , in one year",
    "yes",
]
TRANSFORMER = "sentence_transformers.models.Transformer"
POOLING = "sentence_transformers.models.Pooling"
NORMALIZE = "sentence_transformers.models.Normalize"


def st_folder(root: Path, pooling: dict, normalize: bool, sub: str = "", extra: list | None = None) -> Path:
    """A sentence-transformers model folder as the hub holds one."""
    save_with_tokenizer(hf_model("BertModel", seed=3), root / sub if sub else root)
    settings = {"max_seq_length": 40, "do_lower_case": False}
    (root / sub / "sentence_bert_config.json").write_text(json.dumps(settings))
    (root / "1_Pooling").mkdir()
    (root / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, **pooling}))
    modules = [
        {"idx": 0, "name": "0", "path": sub, "type": TRANSFORMER},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": POOLING},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": NORMALIZE})
    modules += extra or []
    (root / "modules.json").write_text(json.dumps(modules))
    return root


def bundle_vectors(bundle: Path, texts: list[str], variant: str = "fp32") -> np.ndarray:
    """What the service computes: tokens -> the graph's token states -> pooled over each row's
    real tokens -> normalized when the model's own vectors are."""
    manifest = load_bundle_manifest(bundle)
    tokenizer = TextTokenizer.from_dir(bundle)
    encodings = [tokenizer.encode(t, max_length=manifest.max_seq_len) for t in texts]
    feeds = pad_batch(encodings, tokenizer.pad_id)
    session = make_session(manifest.variant_path(bundle, variant))
    states = session.run(None, feeds)[0]
    mode = manifest.pooling["mode"]
    vectors = np.stack([pool_tokens(states[i, : len(e)], mode) for i, e in enumerate(encodings)])
    return normalize(vectors) if manifest.pooling["normalize"] else vectors


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (normalize(a.astype(np.float64)) * normalize(b.astype(np.float64))).sum(-1)


CASES = {
    # The layout of all-MiniLM-L6-v2 (legacy keys, the transformer in the folder itself).
    "mean-legacy-normalized": ({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}, True, ""),
    # Newer keys, the transformer in a sub-folder.
    "cls-subfolder": ({"pooling_mode": "cls"}, False, "0_Transformer"),
    "max-normalized": ({"pooling_mode": ["max"]}, True, ""),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_sentence_transformers_folder_matches_the_package(case, tmp_path):
    st = pytest.importorskip("sentence_transformers")
    pooling, normalized, sub = CASES[case]
    folder = st_folder(tmp_path / "st", pooling, normalized, sub)
    assert main([str(folder), str(tmp_path / "b"), "--variants", "fp32,fused", "--quiet"]) == 0
    manifest = load_bundle_manifest(tmp_path / "b")
    mode = case.split("-")[0]
    assert manifest.task == "embed" and manifest.max_seq_len == 40  # sentence_bert_config's length
    assert manifest.pooling["mode"] == mode and manifest.pooling["normalize"] is normalized
    assert manifest.pooling["dimensions"] == 32 and manifest.outputs[0]["shape"] == ["batch", "sequence", 32]
    reference = st.SentenceTransformer(str(folder), device="cpu").encode(SENTENCES, convert_to_numpy=True)
    for variant in ("fp32", "fused"):
        got = bundle_vectors(tmp_path / "b", SENTENCES, variant)
        assert got.shape == reference.shape
        assert np.abs(got - reference).max() <= 1e-5, (variant, np.abs(got - reference).max())
        assert cosines(got, reference).min() >= 0.99999


def test_a_plain_bert_model_is_a_mean_pooled_encoder_like_transformers(tmp_path):
    model = hf_model("BertModel", seed=4)
    checkpoint = save_with_tokenizer(model, tmp_path / "encoder" / "checkpoint")
    assert (
        main([str(checkpoint), str(tmp_path / "b"), "--variants", "fp32", "--max-seq-len", "48", "--quiet"])
        == 0
    )
    manifest = load_bundle_manifest(tmp_path / "b")
    assert manifest.task == "embed" and manifest.pooling["mode"] == "mean"
    assert manifest.pooling["normalize"] is False  # no Normalize module: the vectors as pooled
    tokenizer = TextTokenizer.from_dir(tmp_path / "b")
    encodings = [tokenizer.encode(t, max_length=48) for t in SENTENCES]
    feeds = pad_batch(encodings, tokenizer.pad_id)
    with torch.no_grad():
        states = model(**{k: torch.from_numpy(v) for k, v in feeds.items()}).last_hidden_state.numpy()
    mask = feeds["attention_mask"][..., None]
    reference = (states * mask).sum(1) / mask.sum(1)
    got = bundle_vectors(tmp_path / "b", SENTENCES)
    assert np.abs(got - reference).max() <= 1e-4
    # --pooling and --normalize replace the default.
    export_bundle(
        checkpoint, tmp_path / "c", variants=("fp32",), max_seq_len=48, pooling="cls", normalize=True
    )
    assert load_bundle_manifest(tmp_path / "c").pooling | {"source": None} == {
        "mode": "cls",
        "normalize": True,
        "dimensions": 32,
        "source": None,
    }
    np.testing.assert_allclose(bundle_vectors(tmp_path / "c", SENTENCES), normalize(states[:, 0]), atol=1e-4)


@pytest.mark.parametrize(
    ("pooling", "extra", "message"),
    [
        ({"pooling_mode": "weightedmean"}, None, "pooling mode 'weightedmean' is not supported"),
        ({"pooling_mode": ["mean", "max"]}, None, "exactly one of mean, cls, max, lasttoken"),
        ({"pooling_mode_mean_tokens": False}, None, "pooling modes none"),
        (
            {"pooling_mode": "mean"},
            [
                {
                    "idx": 2,
                    "name": "2",
                    "path": "2_LayerNorm",
                    "type": "sentence_transformers.models.LayerNorm",
                }
            ],
            "lists modules ['Transformer', 'Pooling', 'LayerNorm']",
        ),
    ],
)
def test_what_cannot_be_reproduced_is_refused_by_name(pooling, extra, message, tmp_path):
    folder = st_folder(tmp_path / "st", pooling, False, extra=extra)
    with pytest.raises(ExportError, match=message.replace("[", r"\[").replace("]", r"\]")):
        export_bundle(folder, tmp_path / "b", variants=("fp32",))
    assert not (tmp_path / "b").exists()


def test_a_sentence_encoder_is_not_exported_as_another_task(tmp_path, capsys):
    folder = st_folder(tmp_path / "st", {"pooling_mode": "mean"}, True)
    assert main([str(folder), str(tmp_path / "b"), "--task", "classify", "--quiet"]) == 1
    assert "sentence-transformers folder: it exports as embed, not classify" in capsys.readouterr().err
    classifier = save_with_tokenizer(
        hf_model("BertForSequenceClassification", ["negative", "positive"]), tmp_path / "cls" / "checkpoint"
    )
    assert main([str(classifier), str(tmp_path / "c"), "--pooling", "cls", "--quiet"]) == 1
    assert "pooling / normalize apply to sentence encoders (embed), not to a classify head" in (
        capsys.readouterr().err
    )
