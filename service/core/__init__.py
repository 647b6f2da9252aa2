"""The face core: what the service and training both run (docs/architecture.md)."""
