"""The ``opro`` command line. Each command group lives in its own section below."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="opro",
    help="Optimize the instruction of a RAG prompt by OPRO: an optimizer LLM proposes, an LLM judge scores.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

# ---- section: models (owner: backends) ---------------------------------------------------------

# ---- end section: models -----------------------------------------------------------------------

# ---- section: dataset (owner: documents / rag / dataset) --------------------------------------

# ---- end section: dataset ----------------------------------------------------------------------

# ---- section: evaluate / judge (owner: judges) -------------------------------------------------

# ---- end section: evaluate / judge -------------------------------------------------------------

# ---- section: optimize (owner: optimizer) ------------------------------------------------------

# ---- end section: optimize ---------------------------------------------------------------------

# ---- section: compare / export (owner: compare) ------------------------------------------------

# ---- end section: compare / export -------------------------------------------------------------


def main() -> None:
    app()


if __name__ == "__main__":
    main()
