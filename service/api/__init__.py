"""The HTTP layer: the app factory, middleware, request parsing, schemas and routes."""
