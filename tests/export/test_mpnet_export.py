"""MPNet checkpoints saved by `transformers` export with every variant and match it, per head; a
sentence-transformers MPNet folder with Dense layers and prompts matches the package."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from export.__main__ import main
from export.bundle import dense_layers, load_bundle_manifest
from export.pipeline import VARIANTS
from export.verify import make_session
from processing.embed import apply_dense, normalize, pool_tokens
from processing.padding import pad_batch
from processing.tokenizer import TextTokenizer
from tests.helpers.encoders import hf_mpnet, save_mpnet

transformers = pytest.importorskip("transformers")

MAX_SEQ_LEN = 48
HEADS = {
    "classify": "MPNetForSequenceClassification",
    "ner": "MPNetForTokenClassification",
    "multiple-choice": "MPNetForMultipleChoice",
    "qa": "MPNetForQuestionAnswering",
    "embed": "MPNetModel",
}
SENTENCES = ["the cat sat on the mat", "john lives in paris", "yes", "where was mary born ? in berlin"]


def feeds_for(task: str, seed: int = 7) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = (2, 3, 21) if task == "multiple-choice" else (4, 21)
    lengths = rng.integers(3, 22, size=shape[:-1])
    lengths.flat[0] = 21
    mask = (np.arange(21) < lengths[..., None]).astype(np.int64)
    ids = np.where(mask == 1, rng.integers(4, 90, size=shape), 1).astype(np.int64)  # pad with <pad>
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def run(bundle, variant: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    manifest = load_bundle_manifest(bundle)
    session = make_session(
        manifest.variant_path(bundle, variant),
        disabled_optimizers=manifest.variants[variant].disabled_optimizers,
    )
    graph_feeds = {i.name: feeds[i.name] for i in session.get_inputs()}  # no token_type_ids in MPNet's graph
    return dict(zip(manifest.output_names, session.run(manifest.output_names, graph_feeds), strict=True))


def reference(model, task: str, feeds) -> dict[str, np.ndarray]:
    with torch.no_grad():
        out = model(
            input_ids=torch.from_numpy(feeds["input_ids"]),
            attention_mask=torch.from_numpy(feeds["attention_mask"]),
        )
    if task == "qa":
        return {"start_logits": out.start_logits.numpy(), "end_logits": out.end_logits.numpy()}
    if task == "embed":
        return {"last_hidden_state": out.last_hidden_state.numpy()}
    return {"logits": out.logits.numpy()}


@pytest.mark.parametrize("task", list(HEADS))
def test_an_mpnet_checkpoint_exports_every_variant_and_matches_transformers(task, tmp_path):
    labels = {"classify": 2, "ner": 9}.get(task, 2)
    model = hf_mpnet(HEADS[task], num_labels=labels)
    checkpoint = save_mpnet(model, tmp_path / "checkpoint")
    assert main([str(checkpoint), str(tmp_path / "b"), "--max-seq-len", str(MAX_SEQ_LEN), "--quiet"]) == 0
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
            if task in ("ner", "qa", "embed"):  # token outputs: real tokens only
                a, b = a[real], b[real]
            assert np.abs(a - b).max() <= tolerance, (variant, name, np.abs(a - b).max())


def st_mpnet_folder(root, pooling: str, dense_activation: str, normalized: bool):
    st = pytest.importorskip("sentence_transformers")
    from sentence_transformers.models import Dense, Normalize, Pooling, Transformer

    save_mpnet(hf_mpnet("MPNetModel", seed=5), root / "hf")
    modules = [Transformer(str(root / "hf"), max_seq_length=40)]
    modules += [Pooling(32, pooling_mode=pooling)]
    modules += [Dense(32, 16, activation_function=getattr(torch.nn, dense_activation)())]
    modules += [Normalize()] if normalized else []
    prompts = {"query": "query: ", "passage": "passage: "}
    model = st.SentenceTransformer(
        modules=modules, device="cpu", prompts=prompts, default_prompt_name="passage"
    )
    model.save(str(root / "st"))
    return st.SentenceTransformer(str(root / "st"), device="cpu"), root / "st"


def bundle_vectors(bundle, texts: list[str], prompt: str = "") -> np.ndarray:
    """What the service does: tokens -> token states -> pooled -> Dense -> normalized."""
    manifest = load_bundle_manifest(bundle)
    tokenizer = TextTokenizer.from_dir(bundle)
    encodings = [tokenizer.encode(prompt + t, max_length=manifest.max_seq_len) for t in texts]
    states = run(bundle, "fp32", pad_batch(encodings, tokenizer.pad_id))["last_hidden_state"]
    mode = manifest.pooling["mode"]
    vectors = np.stack([pool_tokens(states[i, : len(e)], mode) for i, e in enumerate(encodings)])
    vectors = apply_dense(vectors, dense_layers(bundle, manifest))
    return normalize(vectors) if manifest.pooling["normalize"] else vectors


@pytest.mark.parametrize(
    ("pooling", "activation", "normalized"), [("lasttoken", "Tanh", True), ("mean", "Identity", False)]
)
def test_dense_layers_prompts_and_last_token_pooling_match_sentence_transformers(
    pooling, activation, normalized, tmp_path
):
    model, folder = st_mpnet_folder(tmp_path, pooling, activation, normalized)
    assert main([str(folder), str(tmp_path / "b"), "--variants", "fp32", "--quiet"]) == 0
    manifest = load_bundle_manifest(tmp_path / "b")
    assert manifest.pooling["mode"] == pooling and manifest.pooling["dimensions"] == 16
    assert manifest.pooling["dense"]["activations"] == [activation.lower()]
    assert manifest.preprocessing["prompts"] == {"query": "query: ", "passage": "passage: ", "document": ""}
    assert manifest.preprocessing["default_prompt_name"] == "passage"
    for name in ("query", "passage"):
        expected = model.encode(SENTENCES, prompt_name=name, convert_to_numpy=True)
        got = bundle_vectors(tmp_path / "b", SENTENCES, manifest.preprocessing["prompts"][name])
        assert got.shape == expected.shape == (len(SENTENCES), 16)
        assert np.abs(got - expected).max() <= 1e-5, (name, np.abs(got - expected).max())


def test_a_tampered_dense_file_is_refused_at_load(tmp_path):
    from export.bundle import BundleError, verify_bundle_files

    _, folder = st_mpnet_folder(tmp_path, "mean", "Tanh", True)
    assert main([str(folder), str(tmp_path / "b"), "--variants", "fp32", "--quiet"]) == 0
    manifest = load_bundle_manifest(tmp_path / "b")
    verify_bundle_files(tmp_path / "b", manifest, "fp32")
    (tmp_path / "b" / "dense.npz").write_bytes(b"not the weights")
    with pytest.raises(BundleError, match="dense.npz"):
        verify_bundle_files(tmp_path / "b", manifest, "fp32")


def test_unsupported_sentence_transformers_settings_are_refused_by_name(tmp_path, capsys):
    _, folder = st_mpnet_folder(tmp_path, "mean", "Tanh", True)
    dense_dir = next(p for p in folder.iterdir() if p.name.endswith("_Dense"))
    config = json.loads((dense_dir / "config.json").read_text())
    (dense_dir / "config.json").write_text(
        json.dumps({**config, "activation_function": "torch.nn.modules.activation.GELU"})
    )
    assert main([str(folder), str(tmp_path / "b"), "--variants", "fp32", "--quiet"]) == 1
    assert "Dense activation 'torch.nn.modules.activation.GELU' is not supported" in capsys.readouterr().err
    (dense_dir / "config.json").write_text(json.dumps(config))
    pooling = folder / "1_Pooling" / "config.json"
    pooling.write_text(json.dumps({**json.loads(pooling.read_text()), "include_prompt": False}))
    assert main([str(folder), str(tmp_path / "c"), "--variants", "fp32", "--quiet"]) == 1
    assert "include_prompt false" in capsys.readouterr().err
