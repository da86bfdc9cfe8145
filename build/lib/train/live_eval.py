"""Evaluate a running service over HTTP, as a user meets it, with the metrics training reports.

The examples are read and held out by `train.splits` (the trainer's own readers and splits) and
scored by `processing.metrics` (the trainer's metrics). Only the predictions come from the service:
one request per example, a bounded number in flight, 429/503 answers retried after their
`Retry-After`. Torch-free.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from processing.metrics import accuracy, f1_score, get_entities, pearson, span_scores, spearman, squad_scores
from processing.tasks import TASKS

from .examples import ChoiceExample, ClassifyExample, NERExample, QAExample

RETRIED = (429, 503)


class ServiceError(RuntimeError):
    """The service answered an example with an error that retrying does not cure."""


@dataclass
class Served:
    """What the service says about the model it evaluates (from GET /models)."""

    name: str
    labels: list[str] | None
    problem_type: str | None


def request_for(task: str, example: Any, model: str | None) -> tuple[str, dict[str, Any]]:
    """(path, JSON body) of the request a user would send for `example`; the route is the task
    registry's."""
    if task not in LIVE_TASKS:
        raise ValueError(f"no live evaluation for task {task!r}")
    body = LIVE_TASKS[task].body(example)
    if model:
        body["model"] = model
    return TASKS[task].path, body


async def fetch_all(
    url: str,
    requests: Sequence[tuple[str, dict[str, Any]]],
    concurrency: int = 16,
    timeout_s: float = 120.0,
    retries: int = 20,
    progress: Callable[[], None] | None = None,
    headers: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Every request's JSON answer, in order; at most `concurrency` in flight."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    answers: list[dict[str, Any]] = [{} for _ in requests]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(len(requests)):
        queue.put_nowait(index)

    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=limits, headers=headers) as client:

        async def one(index: int) -> dict[str, Any]:
            path, body = requests[index]
            for attempt in range(retries + 1):
                response = await client.post(path, json=body)
                if response.status_code == 200:
                    return response.json()
                if response.status_code not in RETRIED or attempt == retries:
                    raise ServiceError(
                        f"example {index}: {path} answered {response.status_code}: {response.text[:500]}"
                    )
                await asyncio.sleep(float(response.headers.get("retry-after", "0.5") or 0.5))
            raise AssertionError("unreachable")

        async def worker() -> None:
            while not queue.empty():
                index = queue.get_nowait()
                answers[index] = await one(index)
                if progress is not None:
                    progress()

        await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, len(requests))))))
    return answers


def served_model(url: str, task: str, model: str | None, headers: dict[str, str] | None = None) -> Served:
    """The bundle that answers `task` requests (named, or the task's only/default one)."""
    listing = httpx.get(f"{url}/models", timeout=30, headers=headers)
    listing.raise_for_status()
    candidates = [m for m in listing.json()["models"] if m.get("task") == task]
    if model:
        candidates = [m for m in candidates if model in (m.get("name"), m.get("path"))]
    serving = [m for m in candidates if m.get("status") == "ready"]
    if not serving:
        raise ServiceError(f"{url} has no ready {task} model" + (f" named {model!r}" if model else ""))
    chosen = next((m for m in serving if m.get("default")), serving[0])
    return Served(chosen["name"], chosen.get("labels"), chosen.get("problem_type"))


# ----------------------------------------------------------------------------- scoring


def classify_scores(
    examples: list[ClassifyExample], answers: list[dict], labels: list[str], regression: bool
) -> dict[str, float]:
    """`labels`: the model's labels in id order, in the data's own spelling."""
    if regression:
        values = [float(a["value"]) for a in answers]
        gold = [float(e.label) for e in examples]  # type: ignore[arg-type]
        p, s = pearson(values, gold), spearman(values, gold)
        return {"pearson": p, "spearman": s, "corr": (p + s) / 2}
    label2id = {label: i for i, label in enumerate(labels)}
    unknown = sorted({e.label for e in examples} - set(label2id))  # type: ignore[arg-type]
    if unknown:
        raise ServiceError(
            f"data labels {unknown} are not among the model's {labels}; map them with --label-names"
        )
    predicted = [label2id[a["label"]] for a in answers]
    gold = [label2id[e.label] for e in examples]  # type: ignore[index]
    return {"accuracy": accuracy(predicted, gold), "f1": f1_score(predicted, gold, len(labels))}


def classify_live_scores(
    examples: list[ClassifyExample], answers: list[dict], served: Served, label_names: dict[str, str]
) -> dict[str, float]:
    """The service answers in the model's label names; score them in the data's spelling."""
    to_data = {name: code for code, name in label_names.items()}
    labels = [to_data.get(label, label) for label in served.labels or []]
    for answer in answers:
        if answer.get("label") is not None:
            answer["label"] = to_data.get(answer["label"], answer["label"])
    return classify_scores(examples, answers, labels, served.problem_type == "regression")


def word_starts(words: list[str]) -> list[int]:
    """Character offset of each word in the words joined by single spaces (what is sent)."""
    starts, position = [], 0
    for word in words:
        starts.append(position)
        position += len(word) + 1
    return starts


def ner_scores(examples: list[NERExample], answers: list[dict]) -> dict[str, float]:
    """Exact (type, start, end) character spans: training's seqeval-style entity scores. (Its
    token_accuracy compares raw B-/I- tags, which entities do not carry.)"""
    gold: set[tuple[int, str, int, int]] = set()
    predicted: set[tuple[int, str, int, int]] = set()
    for n, (example, answer) in enumerate(zip(examples, answers, strict=True)):
        starts = word_starts(example.words)
        for kind, first, last in get_entities(example.tags):
            gold.add((n, kind, starts[first], starts[last] + len(example.words[last])))
        predicted.update((n, e["entity"], e["start"], e["end"]) for e in answer["entities"])
    return span_scores(gold, predicted)


def choice_scores(examples: list[ChoiceExample], answers: list[dict]) -> dict[str, float]:
    return {"accuracy": accuracy([a["best"] for a in answers], [e.label for e in examples])}  # type: ignore[misc]


def qa_scores(examples: list[QAExample], answers: list[dict]) -> dict[str, float]:
    predictions = {
        e.id: (a["answers"][0]["text"] if a["answers"] else "")
        for e, a in zip(examples, answers, strict=True)
    }
    gold = {e.id: [] if e.is_impossible else [text for text, _ in e.answers] for e in examples}
    return squad_scores(predictions, gold)


@dataclass(frozen=True)
class LiveTask:
    """How one task is sent to the service and scored: its request body per example, its metrics."""

    body: Callable[[Any], dict[str, Any]]
    score: Callable[[list, list[dict], Served, dict[str, str]], dict[str, float]]


LIVE_TASKS: dict[str, LiveTask] = {
    "classify": LiveTask(
        body=lambda e: {"text": e.text, "text_pair": e.text_pair},
        score=classify_live_scores,
    ),
    "ner": LiveTask(
        body=lambda e: {"text": " ".join(e.words)},
        score=lambda examples, answers, _served, _names: ner_scores(examples, answers),
    ),
    "multiple-choice": LiveTask(
        body=lambda e: {"context": e.context, "question": e.question, "choices": e.choices},
        score=lambda examples, answers, _served, _names: choice_scores(examples, answers),
    ),
    "qa": LiveTask(
        body=lambda e: {"question": e.question, "context": e.context},
        score=lambda examples, answers, _served, _names: qa_scores(examples, answers),
    ),
}


def evaluate_live(
    url: str,
    task: str,
    examples: list,
    *,
    model: str | None = None,
    label_names: dict[str, str] | None = None,
    concurrency: int = 16,
    progress: bool = True,
    api_key: str | None = None,
) -> dict[str, float]:
    """The task's metrics for `examples`, predicted by the service at `url`.

    `label_names` maps the data's labels to the model's (SST-2's "0" -> "negative").
    """
    url = url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    served = served_model(url, task, model, headers)
    requests = [request_for(task, e, model) for e in examples]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(requests), desc=f"{task} via {url}", unit="ex")
    try:
        answers = asyncio.run(
            fetch_all(url, requests, concurrency, progress=bar.update if bar else None, headers=headers)
        )
    finally:
        if bar is not None:
            bar.close()
    return LIVE_TASKS[task].score(examples, answers, served, label_names or {})
