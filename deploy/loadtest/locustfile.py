"""Locust load test for all four endpoints, with the same payload mix as benchmarks/loadgen.py.

    pip install locust
    locust -f deploy/loadtest/locustfile.py --host http://127.0.0.1:8080            # web UI on :8089
    locust -f deploy/loadtest/locustfile.py --host http://127.0.0.1:8080 \
        --headless -u 64 -r 8 -t 2m --csv results/locust

The mix: classify 40 %, NER 25 %, QA 20 % (contexts up to ~1,800 words, several windows),
multiple choice 15 %; short, medium and long texts. Every 2xx answer is checked against the
endpoint's response schema and counted as a failure when it does not match. Set API_KEY in the
environment when the service requires one.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

from locust import FastHttpUser, between, events, task

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for benchmarks/
from benchmarks.loadgen_payloads import ENDPOINTS, make_payload, validate_response  # noqa: E402

POOL_SIZE = 256  # prepared payloads per endpoint, so the generator does not cost client CPU
POOLS: dict[str, list[dict]] = {}


@events.init.add_listener
def prepare_payloads(environment, **kwargs) -> None:
    rng = random.Random(int(os.environ.get("LOADTEST_SEED", "0")))
    for endpoint in ENDPOINTS:
        POOLS[endpoint] = [make_payload(endpoint, rng) for _ in range(POOL_SIZE)]


class InferenceUser(FastHttpUser):
    # Think time between a user's requests; raise -u for more load rather than lowering this.
    wait_time = between(0.05, 0.5)

    def on_start(self) -> None:
        key = os.environ.get("API_KEY")
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}

    def call(self, endpoint: str) -> None:
        payload = random.choice(POOLS[endpoint])
        with self.client.post(
            ENDPOINTS[endpoint],
            json=payload,
            headers=self.headers,
            name=ENDPOINTS[endpoint],
            catch_response=True,
        ) as response:
            if not 200 <= response.status_code < 300:
                response.failure(f"HTTP {response.status_code}")
                return
            problem = validate_response(endpoint, payload, response.json())
            if problem:
                response.failure(f"schema: {problem}")

    @task(40)
    def classify(self) -> None:
        self.call("classify")

    @task(25)
    def ner(self) -> None:
        self.call("ner")

    @task(20)
    def qa(self) -> None:
        self.call("qa")

    @task(15)
    def multiple_choice(self) -> None:
        self.call("multiple-choice")
