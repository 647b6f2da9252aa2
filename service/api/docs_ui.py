"""/docs from local files: Swagger UI's assets as the swagger-ui-bundle-v2 package ships them,
served by this service (FastAPI's self-hosting recipe), so the page renders on an air-gapped or
firewalled site where a CDN is out of reach."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

DOCS = "/docs"
ASSETS = f"{DOCS}/assets"


def install(app: FastAPI) -> None:
    """The app is created with docs_url=None and redoc_url=None: FastAPI's own pages load from a CDN."""
    openapi_url = app.openapi_url
    assert openapi_url is not None, "/docs shows the app's OpenAPI schema: create the app with an openapi_url"
    app.mount(ASSETS, StaticFiles(directory=swagger_ui_path), name="docs-assets")

    @app.get(DOCS, include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
            swagger_ui_parameters={"validatorUrl": None},  # Swagger UI's default validator badge is an outside host
        )
