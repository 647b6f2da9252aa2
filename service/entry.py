"""The `facegate` command's entry point, apart from service.cli: multiprocessing runs the main script
again in every process it starts (a single process's image decoders, and its model host with
--model-host; `facegate serve --workers N` goes on re-executed without a script,
service/runtime/serving.py), and the script pip writes imports the module it names. Naming
service.cli there imported Typer, Rich and the settings into every decoder, 23 MiB of private memory
each (docs/benchmarks.md, "The console script in every child"); this module imports nothing until
the command runs."""


def main() -> None:
    from service.cli import main as run

    run()
