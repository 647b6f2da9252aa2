"""The HTTP layer: request/response schemas, body parsing, middleware and routes."""
