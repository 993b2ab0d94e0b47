"""What a plug-in author (a backend, a judge, a proposer, a tracker) tests against, as ``optuna.testing``.

- :class:`~opro.llm.scripted.ScriptedLLM`: a backend whose replies a test scripts (no model, no server).
- :class:`~opro.testing.recorders.MemoryRecorder`: an in-memory recorder, for a command or a search.
- :mod:`opro.testing.worlds`: the keyword world, a search on scripted models whose scores are known.
- The contract suites, each run by importing its tests into a test module (``from
  opro.testing.recorder_contract import *``) and giving the fixture it names:
  :mod:`~opro.testing.backend_contract` (``llm``), :mod:`~opro.testing.judge_contract` (every judge the
  factory builds), :mod:`~opro.testing.proposer_contract` (every registered proposer) and
  :mod:`~opro.testing.recorder_contract` (``kind``).

The suites import pytest: install it to use them (``pip install pytest``).
"""

from opro.llm.scripted import ScriptedLLM
from opro.testing.recorders import MemoryRecorder

__all__ = ["MemoryRecorder", "ScriptedLLM"]
