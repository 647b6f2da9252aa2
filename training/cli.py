"""Training subcommands, registered on the `facegate` command through the `facegate.cli` entry
point. Each command module imports torch inside its commands, so `facegate serve` works without it."""

import typer


def register(app: typer.Typer) -> None:
    from training.cli_heads import heads_app
    from training.cli_train import register_train_commands

    app.add_typer(heads_app, name="heads")
    register_train_commands(app)
