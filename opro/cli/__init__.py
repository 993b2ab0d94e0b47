"""The ``opro`` command line: one module per command group. A command parses its options, calls one
library function and renders what it returns; this module only assembles the app and runs it."""

from __future__ import annotations

import typer

from opro.cli import compare, dataset, doctor, evaluate, export, judge, models, optimize, plan, probe, ui

app = typer.Typer(
    name="opro",
    help="Optimize the instruction of a RAG prompt by OPRO: an optimizer LLM proposes, an LLM judge scores.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Plain help text: Rich markup would eat every [table].key, [auto] and [default: ...] in it.
    rich_markup_mode=None,
)
app.add_typer(models.models_app, name="models")
app.command()(doctor.doctor)
app.add_typer(dataset.dataset_app, name="dataset")
app.add_typer(judge.judge_app, name="judge")
app.command()(plan.plan)
app.command()(probe.probe)
app.command()(optimize.optimize)
app.command()(evaluate.evaluate)
app.command()(compare.compare)
app.command()(export.export)
app.command()(ui.ui)


def main() -> None:
    import atexit
    import contextlib
    import logging
    import os
    import sys

    from opro.cli._common import wrapped_log_format
    from opro.redaction import RedactingFilter

    # MLflow and alembic announce schema creation at INFO on every new store: noise next to progress
    # bars. MLflow sets its own logger's level when it is imported, from this variable.
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    # Traces written as they are made, not by a background queue the exit (os._exit below) would cut
    # off: measured faster too for opro's few hundred traces a command.
    os.environ.setdefault("MLFLOW_ENABLE_ASYNC_TRACE_LOGGING", "false")
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # Every log line (ours, httpx's, MLflow's) passes one redaction before it reaches the terminal; the
    # handler's own level holds back libraries that set theirs to DEBUG (bm25s does).
    handler = logging.StreamHandler()
    handler.setLevel(logging.WARNING)
    handler.setFormatter(wrapped_log_format("%(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactingFilter())
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    code = 1  # an exception that escapes app() exits 1 (Python prints its traceback first)

    def exit_now() -> None:
        # Registered before anything the command imports, so it runs last of the exit handlers: the
        # call cache, MLflow and the log handlers have flushed, and every non-daemon thread has been
        # joined. What is left is the interpreter tearing down thousands of modules (MLflow,
        # SQLAlchemy, pandas, pydantic): about 2 s of every command's exit, with nothing to write.
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)

    atexit.register(exit_now)
    try:
        app()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        raise

