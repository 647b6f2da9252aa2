"""The training commands of `facegate`, one module per command, registered on it by `register`
(through the `facegate.cli` entry point).
Each imports torch inside its command, so registering them costs `facegate serve` nothing. Their
console, `fail` and progress bar are the service's (`service.core.console`)."""

import typer


def register(app: typer.Typer) -> None:
    from training.commands import (
        align,
        calibrate,
        calibrate_cohort,
        calibrate_int8,
        calibrate_open_set,
        evaluate,
        export,
        heads,
        model_info,
        open_set,
        train,
    )

    app.add_typer(heads.heads_app, name="heads")
    app.command("align")(align.align)
    app.command("train")(train.train)
    app.command("eval")(evaluate.eval_)
    app.command("eval-open-set")(open_set.eval_open_set)
    app.command("export")(export.export)
    app.command("calibrate")(calibrate.calibrate)
    app.command("calibrate-cohort")(calibrate_cohort.calibrate_cohort)
    app.command("calibrate-int8")(calibrate_int8.calibrate_int8)
    app.command("calibrate-open-set")(calibrate_open_set.calibrate_open_set)
    app.command("model-info")(model_info.model_info)
