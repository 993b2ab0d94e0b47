"""A configuration is one value (:class:`opro.program.configurations.Configuration`): one parser and one
text form, the names the search, the study and ``opro compare`` use."""

from __future__ import annotations

import itertools

import pytest

from opro.errors import ConfigError
from opro.program.configurations import Configuration, parse_settings
from opro.program.dimensions import DIMENSIONS, Dimension, Value
from opro.program.prompts import QATemplate


def _values(d: Dimension) -> tuple[Value, ...]:
    """Values each dimension takes, from the table: its floor and above, each choice, names a config gives."""
    if d.choices_from is not None:
        return ("task", "small", "0.5b", "gpt-4o-mini")
    if d.kind == "choice":
        return d.choices
    low = max(1, int(d.floor))  # a prompt's settings are positive; the search's floors may be 0
    return (low, low + 1, low * 8 + 3)


@pytest.mark.parametrize("instruction", ["Answer the question.", 'Reply as {"answer": "..."}', "initial", "best"])
def test_every_dimensions_values_read_back_from_the_text_form(instruction: str) -> None:
    for size in (1, 2, len(DIMENSIONS)):
        for dims in itertools.combinations(DIMENSIONS, size):
            for values in itertools.product(*(_values(d)[:2] for d in dims)):
                settings = {d.name: v for d, v in zip(dims, values, strict=True)}
                c = Configuration(instruction, settings)
                text = c.name()
                assert Configuration.parse(text) == c, text
                assert str(c) == text and list(c.settings) == [d.name for d in DIMENSIONS if d.name in settings]
                # ``--set name=value`` goes through the same parser of one setting.
                assert parse_settings(f"{k}={v}" for k, v in reversed(settings.items())) == c.settings
    for d in DIMENSIONS:
        for v in _values(d):
            assert Configuration.parse(f"{instruction} {{{d.name}={v}}}").settings == {d.name: v}


def test_the_text_form_names_only_what_differs_from_the_initial_configuration() -> None:
    initial = {"demos": 0, "top_k": 3, "answer_max_tokens": 64, "retriever": "bm25"}
    c = Configuration("Answer.", {**initial, "answer_max_tokens": 48, "top_k": 3})
    assert c.name(initial) == "Answer. {answer_max_tokens=48}"
    assert Configuration("Answer.", initial).name(initial) == "Answer."
    assert Configuration.parse("Answer.") == Configuration("Answer.") and not Configuration("Answer.").settings
    # A value given both ways is the later one's, in the table's order whatever the order given.
    merged = Configuration.parse("initial {answer_max_tokens=48, top_k=2}").with_settings({"top_k": 1})
    assert str(merged) == "initial {top_k=1, answer_max_tokens=48}"


def test_values_are_checked_through_the_table_with_the_same_words() -> None:
    for text, message in (("x {top_k=0}", "the prompt 'top_k=0': top_k = '0' must be a positive integer"),
                          ("x {top_k=abc}", "top_k = 'abc' must be an integer >= 1"),
                          ("x {retriever=sparse}", "retriever = 'sparse' must be one of 'bm25', 'dense', 'hybrid'"),
                          ("x {rerank=1}", "no search dimension 'rerank'"),
                          ("x {top_k=1, top_k=2}", "top_k is set twice")):
        with pytest.raises(ConfigError, match=message):
            Configuration.parse(text)
    with pytest.raises(ConfigError, match="--set 'top_k': write NAME=VALUE"):
        parse_settings(["top_k"])
    with pytest.raises(ConfigError, match="no search dimension 'rerank'"):
        Configuration("x", {"rerank": 1})


def test_a_configuration_is_frozen_and_a_template_holds_its_settings_in_one_mapping() -> None:
    c = Configuration.parse("Answer. {top_k=1, retriever=hybrid, task_model=small}")
    with pytest.raises(TypeError, match="read-only"):
        c.settings["top_k"] = 2  # type: ignore[index]
    assert len({c, Configuration.parse(str(c))}) == 1
    t = QATemplate(instruction="Answer.").with_settings(**c.settings)
    assert t.configuration == c and t.settings == {"top_k": 1, "retriever": "hybrid", "task_model": "small"}
    assert not hasattr(t, "retriever") and not hasattr(t, "options")  # one mapping, no attribute per dimension
    assert QATemplate.from_json(t.to_json()) == t and hash(QATemplate.from_json(t.to_json())) == hash(t)
