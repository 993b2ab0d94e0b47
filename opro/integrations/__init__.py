"""Bridges to other frameworks. Each submodule imports its framework on import, so ``import opro``
never does: ``opro.integrations.dspy`` serves DSPy from opro's models, cache, ledger and judges."""
