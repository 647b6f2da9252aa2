"""facegate's own routes, a module per URL resource, in the order the OpenAPI schema lists them
(the foreign APIs are `service.api.compat.ROUTERS`)."""

from service.api.routes import duplicates, embed, faces, identify, models, operations, subjects, verify

ROUTERS = (verify.router, identify.router, embed.router, subjects.router, faces.router, duplicates.router, models.router, operations.router)
