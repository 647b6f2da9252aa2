"""The training commands of `facegate`, one module per command (registered by `training.cli`).
Each imports torch inside its command, so registering them costs `facegate serve` nothing. Their
console, `fail` and progress bar are the service's (`service.console`)."""
