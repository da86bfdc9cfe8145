"""/docs and /redoc use Swagger UI and ReDoc files the service serves itself, never a CDN.

The browser test (tests/deploy/test_docs_browser.py) renders them; this checks the pages' links
without a browser, so it runs everywhere.
"""

from __future__ import annotations

import re

import pytest

from tests.app.conftest import serving

PAGES = {"/docs": ("swagger-ui-bundle.js", "swagger-ui.css"), "/redoc": ("redoc.standalone.js",)}


@pytest.mark.parametrize("page", PAGES)
async def test_docs_pages_load_only_local_assets(models_dir, page):
    async with serving(models_dir, ready=False) as (_, client):
        response = await client.get(page)
        assert response.status_code == 200
        links = re.findall(r'(?:src|href)="([^"]+)"', response.text)
        assert links and all(link.startswith("/") for link in links), links
        assert "https://" not in response.text and "fonts.googleapis" not in response.text
        for asset in PAGES[page]:
            (link,) = [link for link in links if link.endswith("/" + asset)]
            served = await client.get(link)
            assert served.status_code == 200 and len(served.content) > 100_000, (link, served.status_code)
            assert served.headers["content-type"].startswith(("text/javascript", "text/css"))


async def test_swagger_ui_asks_no_online_validator(models_dir):
    async with serving(models_dir, ready=False) as (_, client):
        assert '"validatorUrl": null' in (await client.get("/docs")).text
