"""The routes, a module per URL resource, in the order the OpenAPI schema lists them."""

from service.api.compat import compreface
from service.api.routes import embed, faces, identify, operations, subjects, verify

ROUTERS = (verify.router, identify.router, embed.router, subjects.router, faces.router, operations.router, compreface.router)
