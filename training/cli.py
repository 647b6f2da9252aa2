"""Training subcommands, registered on the `facegate` command through the `facegate.cli` entry
point. Each command module imports torch inside its commands, so `facegate serve` works without it."""

import typer


def register(app: typer.Typer) -> None:
    from training.commands import align, calibrate, cohort, evaluate, export, heads, model_info, open_set, quantize, train

    app.add_typer(heads.heads_app, name="heads")
    app.command("align")(align.align)
    app.command("train")(train.train)
    app.command("eval")(evaluate.eval_)
    app.command("eval-open-set")(open_set.eval_open_set)
    app.command("export")(export.export)
    app.command("calibrate")(calibrate.calibrate)
    app.command("calibrate-cohort")(cohort.calibrate_cohort)
    app.command("calibrate-int8")(quantize.calibrate_int8)
    app.command("model-info")(model_info.model_info)
