"""The contract every proposer in the registry (:data:`opro.search.PROPOSERS`) must keep, run over the
registry so a new proposer is covered the day it is registered: on a scripted optimizer LLM and a
given history, it returns usable instructions (new, unique, non-empty, within the length limit), says
which replies it rejected and why, shows the optimizer every prompt it sends, and proposes the same
for the same seed."""

from opro.testing.proposer_contract import *  # noqa: F403
