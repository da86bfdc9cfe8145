"""Our model without the service: a bundle's ONNX session fed by processing/, in-process, on the
server's session options: the single-request and batched references the service is judged against.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from app.engine.registry import session_tuning
from app.engine.runtime import CPU_BATCH_TOKENS, create_runtime
from app.settings import Settings, available_cores
from benchmarks.bench_common import timed
from benchmarks.loadgen import percentiles
from export.bundle import DEFAULT_QA, load_bundle_manifest
from processing import classify as classify_proc
from processing import embed as embed_proc
from processing import qa as qa_proc
from processing.padding import pad_batch
from processing.tokenizer import Encoding, TextTokenizer

# The service's batching limits on a CPU (app/settings.py and app/engine/runtime.py defaults).
MAX_BATCH_SIZE = 32
MAX_BATCH_TOKENS = CPU_BATCH_TOKENS
WINDOW_OVERLAP = 32


class BundleModel:
    """One bundle variant (on CPU unless `device`) with the server's session options: `instances` sessions of
    `threads` intra-op threads each (the server's MODEL_INSTANCES and INTRA_OP_THREADS); `solo`: tuned
    as the server's solo session, which runs a lone request (its threads stop spinning after a run)."""

    def __init__(
        self,
        bundle: str | Path,
        variant: str = "int8",
        threads: int = 0,
        instances: int = 1,
        device: str = "cpu",
        solo: bool = False,
    ):
        self.path = Path(bundle)
        self.manifest = load_bundle_manifest(self.path)
        if variant not in self.manifest.variants:
            raise ValueError(
                f"bundle {self.path} has no {variant!r} variant; it has {sorted(self.manifest.variants)}"
            )
        self.variant = variant
        self.threads = threads or available_cores()
        self.tokenizer = TextTokenizer.from_dir(self.path)
        path = self.manifest.variant_path(self.path, variant)
        disabled = self.manifest.variants[variant].disabled_optimizers  # as the server loads it
        tuning = session_tuning(Settings(), max(1, instances))  # the server's, under this environment
        tuning = tuning.solo() if solo else tuning
        self.runtimes = [
            create_runtime(path, device, self.threads, tuning, disabled_optimizers=disabled, variant=variant)
            for _ in range(max(1, instances))
        ]
        self.runtime, self.task = self.runtimes[0], self.manifest.task
        self.max_seq_len = self.manifest.max_seq_len
        defaults = {**DEFAULT_QA, **(self.manifest.qa_defaults or {})}
        self.max_query_len = int(defaults["max_query_len"])
        self.max_answer_len = int(defaults["max_answer_len"])
        # As app/services.QAService: the stride must fit the smallest window.
        smallest = qa_proc.window_capacity(self.max_seq_len, self.max_query_len)
        self.doc_stride = max(0, min(int(defaults["doc_stride"]), smallest // 2))

    def encodings(self, payload: dict[str, Any]) -> list[Encoding]:
        """The sequences / windows the service would send to the model for one request body."""
        if self.task == "classify":
            text, pair = payload["text"], payload.get("text_pair")
            return classify_proc.encode_for_classify(
                self.tokenizer, text, pair, self.max_seq_len, "truncate", WINDOW_OVERLAP
            )
        if self.task == "qa":
            return [w.encoding for w in self.qa_windows(payload["question"], payload["context"]).windows]
        if self.task == "embed":
            texts = payload["inputs"] if isinstance(payload["inputs"], list) else [payload["inputs"]]
            return [
                e
                for text in texts
                for e in embed_proc.encode_for_embed(self.tokenizer, text, self.max_seq_len, "truncate")
            ]
        raise ValueError(f"model-only reference supports classify, qa and embed bundles, not {self.task!r}")

    def qa_windows(self, question: str, context: str) -> qa_proc.QAInput:
        return qa_proc.make_windows(
            self.tokenizer, question, context, self.max_seq_len, self.doc_stride, self.max_query_len
        )

    def run(self, encodings: Sequence[Encoding]) -> list[dict[str, np.ndarray]]:
        """Model outputs per encoding, in batches within the service's limits."""
        rows: list[dict[str, np.ndarray]] = []
        for batch in pack(list(encodings)):
            outputs = self.runtime.run(pad_batch(batch, self.tokenizer.pad_id))
            rows += [{k: v[i] for k, v in outputs.items()} for i in range(len(batch))]
        return rows

    def answer(self, question: str, context: str, top_k: int = 1) -> tuple[list[qa_proc.Answer], int]:
        """processing.qa end to end: windows, model, n-best answers across windows."""
        qa_input = self.qa_windows(question, context)
        rows = self.run([w.encoding for w in qa_input.windows])
        answers = qa_proc.best_answers(
            qa_input,
            [r["start_logits"] for r in rows],
            [r["end_logits"] for r in rows],
            top_k=top_k,
            n_best=max(20, top_k),
            max_answer_len=self.max_answer_len,
        )
        return answers, len(qa_input.windows)


def pack(
    encodings: list[Encoding], size: int = MAX_BATCH_SIZE, tokens: int = MAX_BATCH_TOKENS
) -> list[list[Encoding]]:
    """Consecutive batches of at most `size` sequences and `tokens` padded tokens (one item may exceed it)."""
    batches: list[list[Encoding]] = []
    current: list[Encoding] = []
    longest = 0
    for enc in encodings:
        new_longest = max(longest, len(enc))
        if current and (len(current) >= size or new_longest * (len(current) + 1) > tokens):
            batches.append(current)
            current, new_longest = [], len(enc)
        current.append(enc)
        longest = new_longest
    if current:
        batches.append(current)
    return batches


def single_request_reference(model: BundleModel, payloads: list[dict], seconds: float) -> dict[str, Any]:
    """Per request, its sequences as the service batches them alone (concurrency 1): ORT time only,
    the requests in turn, each at least once, until `seconds` have passed."""
    requests = itertools.cycle([model.encodings(p) for p in payloads])
    model.run(next(requests))  # warm-up
    _, times = timed(lambda: model.run(next(requests)), 10**9, seconds, min_runs=len(payloads))
    return {f"{k}_ms": v for k, v in percentiles(times).items()} | {"runs": len(times)}


def batched_reference(
    model: BundleModel, payloads: list[dict[str, Any]], seconds: float, sizes: Sequence[int] = (1, 8, 32)
) -> dict[str, Any]:
    """Every sequence of the payload pool, sorted by length, in full batches of each size: `requests_per_s`
    at the service's MAX_BATCH_SIZE (the target's reference), `best` the fastest size."""
    encodings = sorted((e for p in payloads for e in model.encodings(p)), key=len)
    by_size: dict[int, dict[str, Any]] = {}
    for size in sizes:
        batches = [pad_batch(b, model.tokenizer.pad_id) for b in pack(encodings, size=size)]
        passes = run_passes(model.runtimes, batches, seconds)
        elapsed = passes.pop("elapsed_s")
        by_size[size] = {
            "requests_per_s": round(passes["passes"] * len(payloads) / elapsed, 3),
            "sequences_per_s": round(passes["passes"] * len(encodings) / elapsed, 3),
            "batches_per_pass": len(batches),
            **passes,
        }
    reference = by_size.get(MAX_BATCH_SIZE) or by_size[max(by_size)]
    best = max(by_size, key=lambda size: by_size[size]["requests_per_s"])
    return {
        "requests_per_s": reference["requests_per_s"],
        "reference_batch_size": MAX_BATCH_SIZE if MAX_BATCH_SIZE in by_size else max(by_size),
        "best_batch_size": best,
        "best_requests_per_s": by_size[best]["requests_per_s"],
        "sequences_per_request": round(len(encodings) / len(payloads), 3),
        "threads": model.threads,
        "instances": len(model.runtimes),
        "by_batch_size": by_size,
    }


def run_passes(runtimes: Sequence, batches: list[dict[str, np.ndarray]], seconds: float) -> dict[str, Any]:
    """Each runtime in its own thread runs every batch (from its own starting point) for `seconds`;
    returns passes over the batch list (fractions included) and the wall time."""
    for runtime in runtimes:
        runtime.run(batches[-1])  # warm-up on the longest batch
    done = [0] * len(runtimes)
    barrier = threading.Barrier(len(runtimes) + 1)

    def work(index: int) -> None:
        offset = index * len(batches) // len(runtimes)
        barrier.wait()
        deadline = time.perf_counter() + seconds
        while done[index] < len(batches) or time.perf_counter() < deadline:
            runtimes[index].run(batches[(offset + done[index]) % len(batches)])
            done[index] += 1

    workers = [threading.Thread(target=work, args=(i,)) for i in range(len(runtimes))]
    for worker in workers:
        worker.start()
    barrier.wait()
    started = time.perf_counter()
    for worker in workers:
        worker.join()
    return {"passes": sum(done) / len(batches), "elapsed_s": time.perf_counter() - started}
