"""Benchmarks: scripts that print figures (never timed assertions) and the `facegate bench` commands
(registered through the `facegate.cli` entry point, like training's), kept out of the service package."""
