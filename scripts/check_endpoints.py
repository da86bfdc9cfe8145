"""One real request per endpoint against a running service with the default models, each answer
checked for sense (not just a 200). Standard library only, so it runs with any python3.

    python3 scripts/check_endpoints.py http://127.0.0.1:8000

Used by scripts/newcomer_check.sh (after `make serve`) and deploy/podman/contract.py (the image).
"""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Callable
from typing import Any

RERANK_TEXTS = [
    "It was designed by the company of Gustave Eiffel.",
    "The Eiffel Tower is a wrought-iron lattice tower in Paris, France.",
    "A woman is slicing an onion.",
]

CHECKS: list[tuple[str, dict[str, Any], Callable[[Any], bool]]] = [
    (
        "classify",
        {"text": "A wonderful, moving film with a brilliant cast."},
        lambda r: r["label"] == "positive",
    ),
    ("classify", {"text": "Dull, lifeless and far too long."}, lambda r: r["label"] == "negative"),
    (
        "ner",
        {"text": "Angela Merkel met Emmanuel Macron in Paris on Tuesday."},
        lambda r: (
            {"PER", "LOC"} <= {e["entity"] for e in r["entities"]}
            and any(e["text"] == "Paris" for e in r["entities"])
        ),
    ),
    (
        "multiple-choice",
        {
            "context": "The child dropped the glass on the floor and it",
            "choices": ["shattered into pieces.", "sang a song.", "flew away like a bird.", "became a tree."],
        },
        lambda r: r["best"] == 0,
    ),
    (
        "qa",
        {
            "question": "Where is the Eiffel Tower?",
            "context": "The Eiffel Tower is a wrought-iron lattice tower in Paris, France. "
            "It was designed by the company of Gustave Eiffel.",
        },
        lambda r: "Paris" in r["answers"][0]["text"],
    ),
    (
        "embed",
        {"inputs": ["A man is playing a guitar.", "Someone plays an instrument."]},
        lambda r: len(r) == 2 and len(r[0]) == 384 and abs(sum(x * x for x in r[0]) - 1) < 1e-4,
    ),
    (
        "v1/embeddings",
        {"input": "A man is playing a guitar."},
        lambda r: (
            r["object"] == "list"
            and len(r["data"][0]["embedding"]) == 384
            and r["usage"]["prompt_tokens"] == 9
        ),
    ),
    (
        "similarity",
        {
            "inputs": {
                "source_sentence": "A man is playing a guitar.",
                "sentences": ["Someone plays an instrument.", "A woman is slicing an onion."],
            }
        },
        lambda r: r[0] > r[1],
    ),
    (
        "rerank",
        {"query": "Where is the Eiffel Tower?", "texts": RERANK_TEXTS},
        lambda r: [x["index"] for x in r][0] == 1 and r[0]["score"] > 0.5 > r[-1]["score"],
    ),
    (
        "",  # TEI's default route, as huggingface_hub's InferenceClient sends to it
        {"inputs": "A man is playing a guitar.", "parameters": {"normalize": False}},
        lambda r: len(r) == 1 and len(r[0]) == 384 and abs(sum(x * x for x in r[0]) - 1) > 1e-2,
    ),
    ("decode", {"ids": [101, 3000, 1010, 2605, 102]}, lambda r: r == ["paris, france"]),
    (
        "v1/rerank",
        {"query": "Where is the Eiffel Tower?", "documents": RERANK_TEXTS, "top_n": 1},
        lambda r: [x["index"] for x in r["results"]] == [1] and r["model"] == "rerank-minilm",
    ),
]


def post(url: str, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    request = urllib.request.Request(
        f"{url.rstrip('/')}/{path}",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", **(headers or {})},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def problems(
    url: str, headers: dict[str, str] | None = None, verbose: bool = False, checks=CHECKS
) -> list[str]:
    """What went wrong, one line per failed endpoint (empty: every answer made sense)."""
    found = []
    for path, body, holds in checks:
        try:
            answer = post(url, path, body, headers)
        except Exception as error:  # noqa: BLE001 - any failure is a finding, with its reason
            found.append(f"POST /{path}: {error}")
            continue
        if verbose:
            print(f"POST /{path} -> {json.dumps(answer)[:300]}")
        if not holds(answer):
            found.append(f"POST /{path}: unexpected answer {json.dumps(answer)[:300]}")
    return found


if __name__ == "__main__":
    failed = problems(sys.argv[1], verbose=True)
    print("\n".join(failed) or "every endpoint answered sensibly")
    sys.exit(1 if failed else 0)
