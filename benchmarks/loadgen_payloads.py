"""Request payloads and response-schema checks for the four endpoints, shared by the load tools
(loadgen.py, deploy/loadtest/locustfile.py, the tests). Pure Python: no httpx, no locust.
"""

from __future__ import annotations

import functools
import itertools
import random
from typing import Any

ENDPOINTS = {"classify": "/classify", "ner": "/ner", "multiple-choice": "/multiple-choice", "qa": "/qa"}
# Every endpoint a load may name; "all" (ENDPOINTS) is the four-task mix the deploy stack serves.
# embed-32: 32 sentences per request; classify-25w: two sentences, ~25 words (the peer workloads);
# embed-varied(-32): 1 (32) of the 200 varied texts of embed_data.py, some past 256 tokens (against
# sentence-transformers); *-zipf: Zipf-ranked (s=1.1) over 1,000 distinct sentences (the response cache).
BASE = {"embed-32": "embed", "classify-25w": "classify", "embed-varied": "embed", "embed-varied-32": "embed"}
BASE |= {"embed-zipf": "embed", "classify-zipf": "classify"}  # their schema
PATHS = {**ENDPOINTS, "embed": "/embed", **{name: f"/{base}" for name, base in BASE.items()}}
POOL_SIZES = {"embed-zipf": 4096, "classify-zipf": 4096}  # prepared payloads: a sample of the Zipf law
ZIPF_S, DISTINCT = 1.1, 1000
PROTOCOLS = ("ours", "openai", "v2")  # openai: Infinity's /embeddings; v2: MLServer's Open Inference
PEER_MODEL = "peer"  # the model name the peers serve under (Infinity, MLServer)

SENTENCES = [
    "The film opens slowly but the last hour is gripping and beautifully shot.",
    "I would not recommend this restaurant to anyone who values their evening.",
    "Mary Smith joined the Berlin office of Siemens in 2019 after five years in London.",
    "The river Seine flows through Paris before it reaches the English Channel at Le Havre.",
    "Our support team answered within minutes and fixed the billing problem for good.",
    "The battery barely lasts half a day, which makes the phone useless for travel.",
    "John Miller played for the New York team that won the championship in 1998.",
    "The museum was founded in 1851 and holds more than two million objects.",
    "Honestly the plot made no sense, yet the actors seemed to enjoy every scene.",
    "Heavy rain closed the mountain road between Innsbruck and Bolzano for three days.",
    "The new update is fast, stable and finally fixes the sync bug on tablets.",
    "Anna Kowalska studied physics in Warsaw before moving to the University of Toronto.",
]
PEOPLE = ["Mary Smith", "John Miller", "Anna Kowalska", "Kenji Tanaka", "Fatima Haddad", "Pedro Alves"]
CITIES = ["Paris", "Berlin", "London", "Toronto", "Osaka", "Lisbon", "Nairobi", "Denver"]
ORGS = ["Siemens", "the United Nations", "Oxfam", "Toyota", "the BBC", "Nokia"]
JOBS = ["engineer", "teacher", "journalist", "nurse", "architect", "chef"]


def _text(rng: random.Random, size: str) -> str:
    """A short (1 sentence), medium (2-4) or long (12-30, beyond the usual 128-256 token limits) text."""
    count = {"short": 1, "medium": rng.randint(2, 4), "long": rng.randint(12, 30)}[size]
    return " ".join(rng.choice(SENTENCES) for _ in range(count))


def _size(rng: random.Random) -> str:
    return rng.choices(["short", "medium", "long"], weights=[6, 3, 1])[0]


def _facts(rng: random.Random, count: int) -> list[tuple[str, str, str, int, str]]:
    return [
        (rng.choice(PEOPLE), rng.choice(CITIES), rng.choice(ORGS), rng.randint(1950, 2020), rng.choice(JOBS))
        for _ in range(count)
    ]


def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def _fact_sentence(person: str, city: str, org: str, year: int, job: str) -> str:
    return f"{person} was born in {city} in {year} and later worked as {_a(job)} for {org}."


def make_payload(endpoint: str, rng: random.Random) -> dict[str, Any]:
    """One realistic request body for `endpoint`."""
    if endpoint == "classify":
        return {"text": _text(rng, _size(rng))}
    if endpoint == "ner":
        facts = _facts(rng, rng.choice([1, 1, 2, 4, 12]))
        body: dict[str, Any] = {"text": " ".join(_fact_sentence(*f) for f in facts)}
        if rng.random() < 0.5:
            body["aggregation"] = rng.choice(["simple", "first", "average", "max", "none"])
        return body
    if endpoint == "qa":
        # Long contexts (up to 60 facts, ~1,800 words) exercise the service's sliding windows.
        facts = _facts(rng, rng.choice([3, 10, 25, 60]))
        person, city, org, year, job = rng.choice(facts)
        question = rng.choice(
            [f"Where was {person} born?", f"When was {person} born?", f"Who did {person} work for?"]
        )
        context = " ".join(_fact_sentence(*f) + " " + rng.choice(SENTENCES) for f in facts)
        body = {"question": question, "context": context}
        if rng.random() < 0.3:
            body["top_k"] = rng.randint(1, 3)
        return body
    if endpoint == "multiple-choice":
        person, city, _, _, job = _facts(rng, 1)[0]
        n_choices = rng.choice([2, 4, 4, 5])
        wrong = [c for c in CITIES if c != city]
        choices = [f"{person} lives in {c}." for c in [city, *rng.sample(wrong, n_choices - 1)]]
        rng.shuffle(choices)
        context = f"{person} works in {city} as {_a(job)}. " + _text(rng, rng.choice(["short", "medium"]))
        body = {"context": context, "choices": choices}
        if rng.random() < 0.7:
            body["question"] = "Which statement is true?"
        return body
    if endpoint == "embed":
        return {"inputs": rng.choice(SENTENCES)}  # one sentence of ~10 words, the common query
    if endpoint == "embed-32":
        return {"inputs": [rng.choice(SENTENCES) for _ in range(32)]}
    if endpoint == "classify-25w":
        return {"text": " ".join(rng.sample(SENTENCES, 2))}
    if endpoint.startswith("embed-varied"):
        texts, count = _varied(), 32 if endpoint.endswith("32") else 1
        start = rng.randrange(len(texts))
        return {"inputs": [texts[(start + i) % len(texts)] for i in range(count)]}
    if endpoint.endswith("-zipf"):
        text = rng.choices(_distinct(), cum_weights=_zipf_weights())[0]
        return {"inputs": text} if endpoint == "embed-zipf" else {"text": text}
    raise ValueError(f"unknown endpoint {endpoint!r}; choose from {sorted(PATHS)}")


@functools.cache
def _varied() -> list[str]:
    from benchmarks.embed_data import DATA, varied_sentences

    return varied_sentences(DATA)


@functools.cache
def _distinct() -> list[str]:
    combos = itertools.product(PEOPLE, CITIES, ORGS, range(1950, 2000), JOBS)
    return [_fact_sentence(*combo) for combo in itertools.islice(combos, 0, DISTINCT * 7, 7)]


@functools.cache
def _zipf_weights() -> list[float]:
    return list(itertools.accumulate(1 / (k + 1) ** ZIPF_S for k in range(DISTINCT)))


def to_wire(protocol: str, endpoint: str, payload: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(path, body) of `payload` in a peer's protocol; only embed and classify have peers."""
    if protocol == "ours":
        return PATHS[endpoint], payload
    base = BASE.get(endpoint, endpoint)
    if protocol == "openai" and base == "embed":
        texts = payload["inputs"]
        return "/embeddings", {"model": PEER_MODEL, "input": texts if isinstance(texts, list) else [texts]}
    if protocol == "v2" and base == "classify":
        tensor = {"name": "args", "shape": [1], "datatype": "BYTES", "data": [payload["text"]]}
        return f"/v2/models/{PEER_MODEL}/infer", {"inputs": [tensor]}
    raise ValueError(f"no {protocol!r} form of {endpoint!r}")


def from_wire(protocol: str, endpoint: str, body: Any) -> Any:
    """A peer's response in our shape (so validate_response and the answer comparison read it)."""
    if protocol == "openai":
        return [item["embedding"] for item in sorted(body["data"], key=lambda item: item["index"])]
    if protocol == "v2":  # mlserver-huggingface: one JSON text per input, the pipeline's answer
        import json

        answer = body["outputs"][0]["data"][0]
        answer = json.loads(answer) if isinstance(answer, str) else answer
        answer = answer[0] if isinstance(answer, list) else answer
        top = {"label": answer["label"], "score": answer["score"]}
        return {**top, "scores": [top]}
    return body


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _span_problem(items: list[Any], source: str, what: str, field: str) -> str | None:
    """Each item needs `field` (a str, or a number for score) and a score, and offsets that are ints
    inside `source` pointing at its text."""
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not _is_number(item.get("score")):
            return f"{what} {i} needs score: float"
        if field != "score" and not isinstance(item.get(field), str):
            return f"{what} {i} needs {field}: str and score: float"
        start, end = item.get("start"), item.get("end")
        if not (_is_int(start) and _is_int(end) and 0 <= start <= end <= len(source)):
            return f"{what} {i} has bad offsets start={start!r} end={end!r}"
        if source[start:end] != item.get("text"):
            return f"{what} {i} text {item.get('text')!r} != source[{start}:{end}] {source[start:end]!r}"
    return None


def validate_response(endpoint: str, request: dict[str, Any], body: Any) -> str | None:
    """None when `body` matches the endpoint's response schema, else what is wrong."""
    endpoint = BASE.get(endpoint, endpoint)
    if endpoint == "embed":
        n = len(request["inputs"]) if isinstance(request["inputs"], list) else 1
        if not isinstance(body, list) or len(body) != n or not all(isinstance(v, list) and v for v in body):
            return f"embed needs {n} non-empty vectors"
        return None
    if not isinstance(body, dict):
        return f"body is {type(body).__name__}, not an object"
    if endpoint == "classify":
        scores = body.get("scores")
        if not isinstance(body.get("label"), str) or not _is_number(body.get("score")):
            return "classify needs label: str and score: float"
        if not isinstance(scores, list) or not scores:
            return "classify needs a non-empty scores list"
        if not all(
            isinstance(s, dict) and isinstance(s.get("label"), str) and _is_number(s.get("score"))
            for s in scores
        ):
            return "every classify score needs label: str and score: float"
        if body["label"] not in {s["label"] for s in scores}:
            return f"label {body['label']!r} is not among the scores"
        return None
    if endpoint == "ner":
        entities = body.get("entities")
        if not isinstance(entities, list):
            return "ner needs an entities list"
        return _span_problem(entities, request["text"], "entity", "entity")
    if endpoint == "multiple-choice":
        choices, scores, best = request["choices"], body.get("scores"), body.get("best")
        if not isinstance(scores, list) or len(scores) != len(choices) or not all(map(_is_number, scores)):
            return f"scores must be {len(choices)} numbers, got {scores!r}"
        if not _is_int(best) or not 0 <= best < len(choices):
            return f"best {best!r} is not a choice index"
        if body.get("choice") != choices[best]:
            return f"choice {body.get('choice')!r} is not choices[{best}]"
        return None
    if endpoint == "qa":
        answers = body.get("answers")
        if not isinstance(answers, list) or not answers:
            return "qa needs a non-empty answers list"
        if len(answers) > request.get("top_k", len(answers)):
            return f"{len(answers)} answers for top_k={request['top_k']}"
        return _span_problem(answers, request["context"], "answer", "score")
    raise ValueError(f"unknown endpoint {endpoint!r}")
