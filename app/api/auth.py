"""Which key a path needs, and whether a request carries it: one rule for the connection layer
(app/api/connections.py, which refuses before any ASGI request exists) and AuthMiddleware (which
holds under any ASGI server, and for what the connection layer lets through)."""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass

from pydantic import SecretStr

ADMIN_PREFIX = "/admin/"
# Never behind the key: probes (SageMaker's /ping too), metrics, the docs and the V2
# server's health and metadata.
OPEN_PATHS = {"/health", "/ready", "/metrics", "/v2", "/v2/health/live", "/v2/health/ready", "/ping"}
OPEN_PREFIXES = ("/docs", "/redoc", "/openapi.json", "/static-offline-docs/")
V2_READY_PATH = re.compile(r"^/v2/models/[^/]+(?:/versions/[^/]+)?/ready$")


def bearer_ok(authorization: str, key: SecretStr) -> bool:
    """`authorization` is the header's value ("" when absent)."""
    scheme, _, token = authorization.partition(" ")
    # compare_digest: the comparison time must not reveal how much of the key matched.
    return scheme.lower() == "bearer" and hmac.compare_digest(
        token.strip().encode("utf-8"), key.get_secret_value().encode("utf-8")
    )


@dataclass(frozen=True)
class KeyRule:
    """API_KEY on every path but the open ones; ADMIN_API_KEY under /admin/ (whose routes answer
    404 admin_disabled themselves when it is unset)."""

    api_key: SecretStr | None
    admin_api_key: SecretStr | None

    @property
    def keyless(self) -> bool:
        return self.api_key is None and self.admin_api_key is None

    def refusal(self, path: str, authorization: str) -> str | None:
        """None when the request may go on, else the 401's message."""
        if path.startswith(ADMIN_PREFIX):
            key, what = self.admin_api_key, "admin API key"
        elif path in OPEN_PATHS or path.startswith(OPEN_PREFIXES) or V2_READY_PATH.match(path):
            return None
        else:
            key, what = self.api_key, "API key"
        if key is None or bearer_ok(authorization, key):
            return None
        return f"missing or invalid {what}: send 'Authorization: Bearer <key>'"
