"""Foreign APIs on facegate's own engine, gallery, decisions and keys (docs/compat.md): a router
per API, each out of facegate's OpenAPI schema and answering errors in its API's shape."""

from service.api.compat import compreface, deepstack

ROUTERS = (compreface.router, deepstack.router)
# The key middleware's answers in the foreign shape; DeepStack's routes check their key themselves.
KEY_REFUSALS = {compreface.PREFIX + "/": compreface.refused}
# Errors no route of theirs answers (an unknown route or method, a failure outside a route) in the foreign shape.
ERROR_SHAPES = {compreface.PREFIX + "/": compreface.compreface_error}
