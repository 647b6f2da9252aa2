"""/docs renders without a CDN: the page names only this service's own URLs, and each is served."""

from __future__ import annotations

import re


def test_docs_page_loads_every_asset_from_the_service_itself(api):
    page = api.get("/docs")
    assert page.status_code == 200 and "swagger-ui" in page.text
    refs = re.findall(r'(?:src|href)="([^"]+)"', page.text) + re.findall(r"""url: ['"]([^'"]+)['"]""", page.text)
    assert {"/docs/assets/swagger-ui-bundle.js", "/docs/assets/swagger-ui.css", "/openapi.json"} <= set(refs)
    assert "://" not in page.text, "the page names another host"
    for ref in refs:
        assert ref.startswith("/") and not ref.startswith("//"), ref
        answer = api.get(ref)
        assert answer.status_code == 200 and answer.content, ref


def test_redoc_is_not_served_from_a_cdn(api):
    assert api.get("/redoc").status_code == 404
