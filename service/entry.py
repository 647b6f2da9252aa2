"""The `facegate` command's entry point, apart from service.cli: multiprocessing runs the main script
again in every process it starts (the model host, each HTTP worker, each image decoder), and the
script pip writes imports the module it names. Naming service.cli there imported Typer, Rich and the
settings into every decoder, 23 MiB of private memory each (docs/benchmarks.md, "The console script
in every child"); this module imports nothing until the command runs."""


def main() -> None:
    from service.cli import main as run

    run()
