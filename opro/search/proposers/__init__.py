"""Proposal strategies, by the name ``[optimizer].proposer`` gives them.

A new strategy is one module with a :class:`~opro.search.proposers.base.SamplingProposer` subclass
and a ``build`` function, plus one line in :data:`PROPOSERS`.
"""

from __future__ import annotations

from collections.abc import Callable

from opro.errors import ConfigError
from opro.llm.client import ChatClient
from opro.search.proposers import opro, reflect
from opro.search.proposers.base import Proposal, ProposalContext, Proposer, Sample, SamplingProposer
from opro.search.proposers.opro import OproProposer
from opro.search.proposers.reflect import ReflectiveProposer
from opro.search.settings import ProposerSettings

#: name -> build(*, llm, settings, template_text, seed)
PROPOSERS: dict[str, Callable[..., Proposer]] = {
    "opro": opro.build,
    "reflect": reflect.build,
}


def make_proposer(*, settings: ProposerSettings, llm: ChatClient, template_text: str, seed: int = 0) -> Proposer:
    """The proposer ``settings.proposer`` names, over the optimizer LLM ``llm``. ``template_text``:
    the QA template with ``<INS>`` where the instruction goes."""
    build = PROPOSERS.get(settings.proposer)
    if build is None:
        raise ConfigError(
            f"[optimizer].proposer = {settings.proposer!r} is not a proposer; choose one of {sorted(PROPOSERS)}"
        )
    return build(llm=llm, settings=settings, template_text=template_text, seed=seed)


__all__ = [
    "PROPOSERS",
    "OproProposer",
    "Proposal",
    "ProposalContext",
    "Proposer",
    "ReflectiveProposer",
    "Sample",
    "SamplingProposer",
    "make_proposer",
]
