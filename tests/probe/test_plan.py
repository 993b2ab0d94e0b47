"""`opro plan`: what a run can detect and what it will ask, checked against scripted runs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from fakes import experiment_config, scripted_pool, write_toml
from typer.testing import CliRunner

import opro.experiment
from opro.cli import app
from opro.config import config_from_dict
from opro.probe.plan import DEFAULT_DIFFERENCE_SD, DEFAULT_DIFFERENCE_SDS, check, make_plan


def _config(tmp_path: Path, **overrides: dict) -> object:
    return config_from_dict(experiment_config(tmp_path, **overrides), base_dir=tmp_path, source="t.toml")


def test_optimize_prints_its_plan_and_then_the_plan_beside_what_it_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(opro.experiment, "ModelPool", lambda: scripted_pool())
    config = write_toml(experiment_config(tmp_path, optimizer={"steps": 2, "candidates_per_step": 2,
                                                               "minibatch_size": 2, "pruner": "none"}),
                        tmp_path / "exp.toml")
    result = CliRunner().invoke(app, ["optimize", str(config), "--no-progress"])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert said.startswith("plan for ") and "plan vs run:" in said
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    usage = json.loads((tmp_path / "out" / "summary.json").read_text())["usage"]
    made = {role: u["calls"] + u["cache_hits"] for role, u in usage.items()}
    planned = {r["role"]: r["search_calls"] + r["validation_calls"] + r["generation_calls"] for r in plan["roles"]}
    # The scripted search prunes nothing here: the search's calls are exactly its plan.
    for role in ("task", "judge"):
        search_max = next(r for r in plan["roles"] if r["role"] == role)
        assert search_max["search_calls"] == (1 + 2 * 2) * 3
        assert abs(made[role] - planned[role]) <= 0.2 * planned[role], (role, made[role], planned[role])
    assert sum(made.values()) == pytest.approx(sum(planned.values()), rel=0.2)
    lines = check(plan, usage, wall_s=1.0)
    assert lines[0].startswith(f"plan vs run: {sum(planned.values()):.0f} ")
    assert f"calls planned, {sum(made.values())} made" in lines[0]


def test_the_plan_says_when_no_gain_can_be_claimed_or_confirmed(tmp_path: Path) -> None:
    split = {"exemplar": 2, "optimization": 3, "validation": 4, "heldout": 5, "seed": 1}
    small = make_plan(_config(tmp_path, data={"split": split}, optimizer={"validation_extension": 0}))
    assert small.detectable is None and small.heldout_detectable is None
    assert any("cannot claim a gain: on 2 confirmation questions no sample of 1-5 scores reaches alpha 0.05" in w
               for w in small.warnings)
    assert any("`opro compare` cannot find a significant difference on 5 held-out" in w for w in small.warnings)
    # The 10 questions of the 24 in no split: the confirmation may extend into them, and then can claim.
    extended = make_plan(_config(tmp_path, data={"split": split}))
    assert extended.extension_expected == 10 and extended.looks == (1, 2, 12) and extended.detectable is not None
    # At most: every question but the validation split's (a split that comes out smaller leaves the rest unused).
    assert extended.extension_questions == 20
    assert not any("cannot claim" in w for w in extended.warnings)
    assert ("2 confirmation questions + up to 20 extension questions (about 10 expected), looks at 1, 2, 12"
            in " ".join(extended.lines()))
    # The betting test detects nothing on 6 held-out pairs in 80% of runs (a claim there needs every pair at +4).
    six = make_plan(_config(tmp_path, data={"split": {**split, "heldout": 6}}))
    assert six.heldout_detectable is None
    assert any("finds no difference significant in 80% of runs on 6 held-out questions" in w for w in six.warnings)
    big = make_plan(_config(tmp_path, questions=40, data={"split": {"exemplar": 2, "optimization": 3,
                                                                    "validation": 16, "heldout": 12, "seed": 1}}))
    assert big.detectable is not None and big.heldout_detectable is not None
    assert not any("cannot" in w for w in big.warnings)
    assert big.difference_sd == DEFAULT_DIFFERENCE_SD and big.sd_basis.startswith("default")
    text = "\n".join(big.lines())
    assert f"validation {big.detectable:+.2f} points" in text and "held-out compare" in text


def test_the_default_noise_is_the_one_of_the_paired_mode_in_use(tmp_path: Path) -> None:
    split = {"exemplar": 2, "optimization": 3, "validation": 16, "heldout": 6, "seed": 1}
    for mode in ("pointwise", "side_by_side"):
        made = make_plan(_config(tmp_path, data={"split": split}, judge={"paired": mode}))
        assert made.difference_sd == DEFAULT_DIFFERENCE_SDS[mode]
        assert made.sd_basis.startswith(f"default ({mode.replace('_', ' ')})")


def test_more_validation_questions_detect_a_smaller_gain_and_the_last_run_sets_the_noise(tmp_path: Path) -> None:
    def plan(validation: int) -> object:
        return make_plan(_config(tmp_path, questions=80, data={
            "split": {"exemplar": 2, "optimization": 3, "validation": validation, "heldout": 10, "seed": 1}}))

    assert plan(12).detectable > plan(24).detectable > plan(48).detectable  # type: ignore[attr-defined, operator]
    out = tmp_path / "out"
    out.mkdir()
    scores = [3.0, 4.0, 5.0, 3.0, 2.0, 4.0, 3.0, 4.0, 3.0, 5.0, 4.0, 3.0]
    validation = {"initial_scores": [3.0] * 12, "finalists": [{"chosen": True, "scores": scores}]}
    (out / "summary.json").write_text(json.dumps({"validation": validation, "noise_digest": "d1"}))
    measured = make_plan(_config(tmp_path, questions=80, data={
        "split": {"exemplar": 2, "optimization": 3, "validation": 24, "heldout": 10, "seed": 1}}), noise_digest="d1")
    assert measured.sd_basis == "the last run's validation stage (12 pairs)"
    assert measured.difference_sd == pytest.approx(0.9003, abs=1e-3)
    assert measured.detectable < plan(24).detectable * 2  # type: ignore[operator]


def test_where_the_split_falls_short_the_plan_says_how_many_validation_questions_would_confirm_the_claim(
    tmp_path: Path,
) -> None:
    split = {"exemplar": 2, "optimization": 3, "validation": 20, "heldout": 10, "seed": 1}
    cost = make_plan(_config(tmp_path, questions=60, data={"split": split},
                             optimizer={"objective": "cost", "margin": 0.25}))
    need = cost.questions_needed
    # 20 validation questions (4 selection) and 20 of the 25 in no split: a margin of 0.25 at the default
    # paired sd needs more, the pool the rest.
    assert need is not None and need.claim == "margin" and need.target == 0.25 and need.have == 40
    assert need.confirms == cost.cost.confirmable_margin and need.questions > 40  # type: ignore[union-attr, operator]
    assert need.pool == need.questions - 20 - 25  # type: ignore[operator]
    command = f"opro dataset pool {tmp_path / 'out' / 'dataset'} --docs {tmp_path / 'docs'} --pool {need.pool}"
    said = "\n".join(cost.lines())
    assert (f"{need.questions} validation questions would confirm the 0.25 asked: `{command}` generates the "
            f"{need.pool} more") in said
    saved = json.loads(json.dumps(cost.as_dict()))
    assert saved["questions_needed"]["questions"] == need.questions and saved["questions_needed"]["pool"] == need.pool
    # Under quality the claim is a gain of +0.5.
    quality = make_plan(_config(tmp_path, questions=60, data={"split": split})).questions_needed
    assert quality is not None and quality.claim == "gain" and quality.target == 0.5


def test_the_plan_counts_the_generator_calls_when_the_dataset_is_generated(tmp_path: Path) -> None:
    from llama_index.core.schema import Document

    cfg = experiment_config(tmp_path)
    cfg["data"] = {k: v for k, v in cfg["data"].items() if k not in ("dataset", "query_field", "answer_field")}
    text = " ".join(f"Sentence {i} says something about AlexNet and its training." for i in range(200))
    docs = [Document(text=text)]
    made = make_plan(config_from_dict(cfg, base_dir=tmp_path, source="t.toml"), documents=lambda: docs)
    generator = next(r for r in made.roles if r.role == "generator")
    from opro.data.generation import select_chunks
    from opro.program.retrieval import chunk_documents

    chunks = len(select_chunks(chunk_documents(docs, chunk_size=64, chunk_overlap=0), max_chunks=None))
    # One call per chunk for its questions (2 per chunk here), one per kept question for its answer.
    assert chunks > 1 and generator.generation_calls == pytest.approx(chunks * (1 + 0.8 * 2))


def test_the_generation_is_timed_by_the_generators_measured_rate_on_this_machine(tmp_path: Path) -> None:
    """Issue 60: a first run's dataset generation took 1,780 s against 9 minutes planned from the idle
    default. Once a command has measured the generator's model here (the call cache's folder keeps its
    rate), the plan times the generation by that rate and says so; until then by the default, saying
    that nothing was measured here."""
    from llama_index.core.schema import Document

    from opro.llm.rates import rates_path, record_rates

    cfg = experiment_config(tmp_path)
    cfg["data"] = {k: v for k, v in cfg["data"].items() if k not in ("dataset", "query_field", "answer_field")}
    embedded = "qwen2.5-coder-1.5b-instruct"
    cfg["models"]["generator"] = {"backend": "llamacpp", "model": embedded}
    config = config_from_dict(cfg, base_dir=tmp_path, source="t.toml")
    docs = [Document(text=" ".join(f"Sentence {i} says something about AlexNet and its training." for i in range(200)))]

    def generator() -> object:
        return next(r for r in make_plan(config, documents=lambda: docs).roles if r.role == "generator")

    default = generator()
    assert default.generation_calls > 0 and "nothing measured here yet" in default.basis
    # The 1.5B model measured three times slower than the idle default on this machine.
    prompt, completion = default.prompt_tokens_per_call, default.completion_tokens_per_call
    record_rates({f"llamacpp:{embedded}": {"calls": 10, "prompt_tokens": 10 * prompt, "completion_tokens": 10 * completion,
                                          "wall_s": 30 * default.seconds_per_call}},
                 path=rates_path(config.call_cache_path))
    measured = generator()
    assert measured.seconds_per_call == pytest.approx(3 * default.seconds_per_call)
    assert measured.seconds == pytest.approx(3 * default.seconds)
    assert measured.basis.startswith("measured here: 10 calls on ") and "3.0x the idle default" in measured.basis


def test_a_model_with_a_price_gets_a_cost(tmp_path: Path) -> None:
    from opro.errors import ConfigError

    models = {"judge": {"backend": "scripted", "model": "judge", "price_prompt": 1.0, "price_completion": 4.0}}
    made = make_plan(_config(tmp_path, models=models))
    judge = next(r for r in made.roles if r.role == "judge")
    assert judge.cost_usd == pytest.approx(
        judge.calls * (judge.prompt_tokens_per_call * 1.0 + judge.completion_tokens_per_call * 4.0) / 1e6)
    assert made.cost_usd == judge.cost_usd and all(r.cost_usd is None for r in made.roles if r.role != "judge")
    assert f"${judge.cost_usd:.2f}" in "\n".join(made.lines())
    with pytest.raises(ConfigError, match="give both price_prompt and price_completion"):
        _config(tmp_path, models={"judge": {"backend": "scripted", "model": "judge", "price_prompt": 1.0}})


def test_without_an_earlier_run_the_calibrated_judge_noise_is_used(tmp_path: Path) -> None:
    from opro.calibration.calibrate import CalibrationReport, RetestStats, judge_signature, write_calibration

    cfg = _config(tmp_path)
    report = CalibrationReport(
        judge="judge", method="logits", dataset="d", n_questions=10, seed=0, conditions=(), auc=None,
        separation=None, invalid_rate=None, auc_most_likely=None, s_per_call=None, calls=10, cache_hits=0,
        retest=RetestStats(n=10, exact=0.5, within_1=1.0, mean_abs_difference=0.4, sd=0.5),
        signature=judge_signature(cfg))  # type: ignore[arg-type]
    write_calibration(report, [], output_dir=cfg.output_dir, plot=False)  # type: ignore[attr-defined]
    made = make_plan(cfg)
    assert made.difference_sd == pytest.approx(0.5 * 2 ** 0.5)
    assert made.sd_basis.startswith("opro judge calibrate's test-retest noise")


def test_the_side_by_side_judge_is_planned_at_the_calls_it_makes(tmp_path: Path) -> None:
    """Each validation answer keeps its pointwise score; a side-by-side pair adds a call per order shown, two
    where the scores come from logits (one per answer): 1, 2, 3 judge calls per answer."""
    split = {"exemplar": 2, "optimization": 3, "validation": 16, "heldout": 6, "seed": 1}

    def per_answer(**judge: object) -> float:
        roles = {r.role: r for r in make_plan(_config(tmp_path, data={"split": split}, judge=judge)).roles}  # type: ignore[attr-defined]
        assert roles["judge"].search_calls == roles["task"].search_calls
        assert roles["judge"].validation_calls_max == pytest.approx(roles["task"].validation_calls_max * (
            roles["judge"].validation_calls / roles["task"].validation_calls))
        return roles["judge"].validation_calls / roles["task"].validation_calls  # type: ignore[no-any-return]

    assert per_answer() == 1.0
    assert per_answer(paired="side_by_side", score_from="reply") == 1.5
    assert per_answer(paired="side_by_side", score_from="reply", both_orders=True) == 2.0
    assert per_answer(paired="side_by_side", score_from="logits", both_orders=True) == 3.0


def test_the_plan_names_the_open_search_space_and_counts_bootstrapping(tmp_path: Path) -> None:
    def plan(**space: object) -> object:
        cfg = experiment_config(tmp_path, search={"space": space} if space else {})
        return make_plan(config_from_dict(cfg, base_dir=tmp_path))

    plain = plan()
    assert not any(line.startswith("search space") for line in plain.lines())  # type: ignore[attr-defined]
    refs = plan(demos=[0, 2], top_k=[1, 3])
    assert "search space: the wording, and demos [0, 2]; top_k [1, 3]" in " ".join(refs.lines())  # type: ignore[attr-defined]
    boot = plan(demos=[0, 2], demo_source="bootstrapped")
    task = {r.role: r for r in boot.roles}["task"]  # type: ignore[attr-defined]
    # The exemplar questions answered once for the pool (2), and the first move (demos 2 with the
    # initial instruction) on the optimization questions.
    assert boot.first_moves == ("demos=2",)  # type: ignore[attr-defined]
    n_opt = boot.split["optimization"]  # type: ignore[attr-defined]
    assert task.search_calls == {r.role: r for r in plain.roles}["task"].search_calls + 2 + n_opt  # type: ignore[attr-defined]


def test_the_task_prompts_are_estimated_over_the_open_choices(tmp_path: Path) -> None:
    """Demonstrations and larger settings lengthen the task's prompts: the estimate averages the
    choices the sampler spreads candidates over (the worse-start run's task prompts were 1.7 times the
    estimate that left them out)."""
    def task_prompt(**space: object) -> float:
        cfg = experiment_config(tmp_path, search={"space": space} if space else {}, rag={"top_k": 2, "chunk_size": 256})
        made = make_plan(config_from_dict(cfg, base_dir=tmp_path))
        return {r.role: r for r in made.roles}["task"].prompt_tokens_per_call

    plain = task_prompt()
    assert plain == pytest.approx(120 + 0.8 * 2 * 256)
    assert task_prompt(top_k=[1, 2, 3]) == pytest.approx(plain)  # the same mean
    assert task_prompt(top_k=[2, 4]) == pytest.approx(120 + 0.8 * 3 * 256)
    assert task_prompt(chunk_size=[256, 512]) == pytest.approx(120 + 0.8 * 2 * 384)
    assert task_prompt(demos=[0, 2], demo_chars=400) == pytest.approx(plain + 1 * (400 / 4 + 60))


def test_the_plan_prices_each_open_choice_and_what_a_cost_objective_can_confirm(tmp_path: Path) -> None:
    """Issue 50, item 4: the expected cost per answer of each open choice (the prompt-length estimate,
    completion weighted), and with objective = "cost" the smallest margin the splits confirm and the
    saving range of the space."""
    def plan(validation: int, heldout: int, **over: dict) -> object:
        split = {"exemplar": 2, "optimization": 3, "validation": validation, "heldout": heldout, "seed": 1}
        return make_plan(_config(tmp_path, questions=5 + validation + heldout, rag={"top_k": 2, "chunk_size": 256},
                                 search={"space": {"top_k": [1, 4], "answer_max_tokens": [32, 128]}},
                                 data={"split": split}, **over))

    quality = plan(20, 10)
    c = quality.cost  # type: ignore[attr-defined]
    by = {(x.dimension, x.value): x for x in c.choices}
    assert set(by) == {("top_k", 1), ("top_k", 2), ("top_k", 4), ("answer_max_tokens", 32), ("answer_max_tokens", 128)}
    one = by[("top_k", 1)]  # the other settings the initial configuration's (answer_max_tokens 128: 70 estimated)
    assert (one.prompt_tokens, one.completion_tokens) == pytest.approx((120 + 0.8 * 256, 70))
    assert one.cost == pytest.approx(one.prompt_tokens + 4 * one.completion_tokens) and c.unit == "tokens"
    assert by[("top_k", 2)] == replace(c.initial, dimension="top_k", value=2)
    said = "\n".join(quality.lines())  # type: ignore[attr-defined]
    assert f"top_k: 1: {one.prompt_tokens + one.completion_tokens:,.0f} tokens (weighted {one.cost:,.0f})" in said
    assert "completion x4" in said and "objective cost" not in said and c.confirmable_margin is None
    # Prices turn the tokens into money.
    priced = plan(20, 10, models={"task": {"backend": "scripted", "model": "task", "price_prompt": 1.0,
                                           "price_completion": 4.0}}).cost  # type: ignore[attr-defined]
    assert priced.unit == "usd" and priced.initial.cost == pytest.approx(
        (priced.initial.prompt_tokens + 4 * priced.initial.completion_tokens) / 1e6)
    # objective = "cost": the smallest confirmable margin shrinks with more validation questions, and a
    # margin below it is warned about.
    small = plan(20, 10, optimizer={"objective": "cost", "margin": 0.25})
    big = plan(120, 10, optimizer={"objective": "cost", "margin": 0.25})
    s, b = small.cost, big.cost  # type: ignore[attr-defined]
    assert s.confirmable_margin > b.confirmable_margin > 0
    assert s.confirmable_margin > 0.25 and any("[optimizer].margin 0.25" in w for w in small.warnings)  # type: ignore[attr-defined]
    wide = plan(20, 10, optimizer={"objective": "cost", "margin": round(s.confirmable_margin + 0.05, 2)})
    assert not any("[optimizer].margin" in w for w in wide.warnings)  # type: ignore[attr-defined]
    # One-sided, the held-out non-inferiority test confirms less than the two-sided test detects; on
    # too few held-out questions none.
    assert 0 < s.heldout_margin < small.heldout_detectable  # type: ignore[attr-defined]
    assert plan(20, 4, optimizer={"objective": "cost"}).cost.heldout_margin is None  # type: ignore[attr-defined]
    # The saving range: the dearest choices together (top_k 4, 70 tokens) to the cheapest (top_k 1, 32 tokens).
    cheapest = 120 + 0.8 * 256 + 4 * 32
    dearest = 120 + 0.8 * 4 * 256 + 4 * 70
    assert s.saving_range == pytest.approx((1 - dearest / s.initial.cost, 1 - cheapest / s.initial.cost))
    assert "expected saving across the space: " in "\n".join(small.lines())  # type: ignore[attr-defined]


def test_a_validation_that_went_to_its_last_look_is_within_the_plan_not_beyond_it() -> None:
    role = {"search_calls": 15, "validation_calls": 26.0, "validation_calls_max": 54.0, "generation_calls": 0.0}
    plan = {"roles": [{"role": "task", **role}, {"role": "optimizer", "search_calls": 6.0, "validation_calls": 0.0,
                                                   "validation_calls_max": 0.0, "generation_calls": 0.0}],
            "seconds": 600.0}
    lines = check(plan, {"task": {"calls": 66, "cache_hits": 3}, "optimizer": {"calls": 6, "cache_hits": 0}}, wall_s=540)
    assert lines[1] == "  task: planned 41 (at most 69) calls, made 69 (+68%; within the most planned)"
    assert lines[2] == "  optimizer: planned 6 calls, made 6 (+0%)"
    assert lines[0].startswith("plan vs run: 47 (at most 75) calls planned, 75 made (+60%; within the most planned)")
    beyond = check(plan, {"task": {"calls": 70, "cache_hits": 0}}, wall_s=540)
    assert beyond[1] == "  task: planned 41 (at most 69) calls, made 70 (+71%)"


# -- issue 61, item 4: noise that belongs to the task ----------------------------------------------------------


def _noisy_pool() -> object:
    """Answers that differ by prompt and a judge whose score follows the answer: a paired sd above 0."""
    import hashlib

    from opro.llm import GenerationOptions, Message
    from opro.llm.pool import ModelPool
    from opro.llm.scripted import ScriptedLLM

    def task(messages: tuple[Message, ...], options: GenerationOptions) -> str:
        return "Answer " + hashlib.sha256(messages[-1].content.encode()).hexdigest()[:8]

    def judge(messages: tuple[Message, ...], options: GenerationOptions) -> str:
        h = int(hashlib.sha256(messages[-1].content.encode()).hexdigest(), 16)
        return json.dumps({"score": 1 + h % 5, "reasoning": "scripted"})

    def optimizer(messages: tuple[Message, ...], options: GenerationOptions) -> str:
        return f"<INS>Reply briefly and quote the passage you used, variant {options.seed}.</INS>"

    return ModelPool(scripted={"task": ScriptedLLM(default=task, model="task"),
                               "judge": ScriptedLLM(default=judge, model="judge"),
                               "optimizer": ScriptedLLM(default=optimizer, model="optimizer")})


def test_a_stored_probe_and_summary_are_used_only_for_the_task_they_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 61: the plan took a stored probe's noise when only its task and judge model names matched, and
    the last summary.json's without a check, and planned by a 6-question pilot's point estimate (which
    underestimates the paired sd: median 0.74 against a true 0.99 in a heavy-tailed world)."""
    from opro.experiment import Experiment
    from opro.probe.plan import sd_upper_bound

    monkeypatch.setattr(opro.experiment, "ModelPool", _noisy_pool)
    monkeypatch.setenv("COLUMNS", "300")
    data = experiment_config(tmp_path, questions=30, optimizer={"validation_extension": 2})
    config = write_toml(data, tmp_path / "exp.toml")
    runner = CliRunner()
    done = runner.invoke(app, ["probe", str(config), "--no-progress", "--questions", "6", "--no-mlflow"])
    assert done.exit_code == 0, done.output
    probed = json.loads((tmp_path / "out" / "probe.json").read_text())
    sd = probed["judge"]["pilot_sd"]
    assert sd > 0.3 and probed["noise_digest"]
    # 6 pilot questions: the plan takes the sd's one-sided 90% upper bound, not the point estimate, and says so.
    said = " ".join(runner.invoke(app, ["plan", str(config)]).output.split())
    bound = sd_upper_bound(sd, 6)
    assert bound > 1.7 * sd
    assert (f"paired score sd {bound:.2f}: opro probe's pilot (6 questions, the median over its contrasts); "
            f"measured {sd:.2f} on 6 pairs, fewer than 12: its one-sided 90% upper bound") in said
    # The same names on another dataset (its questions reworded) in the same output folder: not this task's noise.
    (tmp_path / "other.jsonl").write_text("\n".join(json.dumps({"question": f"Another fact {i} about AlexNet?",
                                                               "answer": f"Answer {i}."}) for i in range(30)))
    data["data"]["dataset"] = str(tmp_path / "other.jsonl")
    other = write_toml(data, tmp_path / "other.toml")
    exp = Experiment.from_file(other, progress=False)
    try:
        _ = exp.dataset  # prepared: the plan can tell which data it is
        digest = exp.noise_digest()
    finally:
        exp.close()
    assert digest is not None and digest != probed["noise_digest"]
    assert "paired score sd 1.30: default" in runner.invoke(app, ["plan", str(other)]).output
    # A summary.json is read the same way: its digest must be this config's; one without a digest is not used.
    pairs = {"initial_scores": [3.0] * 12, "finalists": [{"chosen": True, "scores": [3.0, 5.0, 1.0] * 4}]}
    for recorded, why in ((None, "it records no noise digest (an older opro)"),
                          (probed["noise_digest"], "it was measured on another dataset, split, judge or task model"),
                          (digest, None)):
        (tmp_path / "out" / "summary.json").write_text(json.dumps({"validation": pairs, "noise_digest": recorded}))
        said = " ".join(runner.invoke(app, ["plan", str(other)]).output.split())
        if why is None:
            assert "paired score sd 1.71: the last run's validation stage (12 pairs)" in said and "noise:" not in said
        else:
            assert "paired score sd 1.30: default" in said
            assert f"noise: the last run's validation noise (12 pairs in summary.json) is not used: {why}" in said


# -- issue 61, item 6: the plan's "at most" bounds the run, and plan vs run counts this run ----------------------

_WORDS = [f"{a}{b}" for a in ("ka", "lo", "mi", "nu", "pe", "ra", "su", "ti", "vo", "ze")
          for b in ("rim", "dax", "pol", "fen", "gut", "hal", "jor", "wex", "yib", "zum")]


def _generated_world() -> object:
    """A generator that keeps every question it is asked for (more than the plan's usual 80%), a task that
    names the instruction and the question, and a judge that scores any candidate one point above the
    initial instruction on every other question: ahead, but not decided on the split's 8 confirmation
    questions, so the validation goes on to its extension look."""
    import hashlib
    import random
    import re

    from fakes import optimizer_reply

    from opro.llm import GenerationOptions, Message
    from opro.llm.pool import ModelPool
    from opro.llm.scripted import ScriptedLLM

    def digest(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()

    def task(messages: tuple[Message, ...], options: GenerationOptions) -> str:
        prompt = messages[-1].content
        query = re.search(r"Query: (.*)", prompt)
        kind = "INIT" if "Answer the question." in prompt else "CAND"
        return f"ANSWER {kind} {digest(query.group(1) if query else prompt)[:6]}"

    def judge(messages: tuple[Message, ...], options: GenerationOptions) -> str:
        found = re.search(r"ANSWER (INIT|CAND) ([0-9a-f]{6})", messages[-1].content)
        lift = found is not None and found.group(1) == "CAND" and int(found.group(2), 16) % 2 == 0
        return json.dumps({"score": 3 + lift, "reasoning": "scripted"})

    def generator(messages: tuple[Message, ...], options: GenerationOptions) -> str:
        prompt = messages[-1].content
        if "Teacher/Professor" in prompt:
            rng = random.Random(digest(prompt))
            return "\n".join(f"{i}. What does {' '.join(rng.sample(_WORDS, 5))} mean?" for i in (1, 2))
        query = re.search(r"Query: (.*)\nAnswer:", prompt)
        return f"Answer to: {query.group(1) if query else '?'}"

    return ModelPool(scripted={name: ScriptedLLM(default=reply, model=name) for name, reply in (
        ("task", task), ("judge", judge), ("optimizer", optimizer_reply), ("generator", generator))})


def test_the_plans_at_most_bounds_what_a_run_to_its_extension_look_asks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 61: the quickstart planned "up to 11 extension questions" and "142 (at most 189) calls", then asked
    14 extension questions and made 204 calls (task and judge 69 each against "at most 63"): the plan counted
    the unused questions of a dataset still to be generated at the share usually kept (80%), and took that
    estimate as the most. A generator that keeps every question: the run asks more than the estimate, and
    no role more than the plan's at most."""
    import random

    monkeypatch.setattr(opro.experiment, "ModelPool", _generated_world)
    monkeypatch.setenv("COLUMNS", "200")
    rng = random.Random(0)
    doc = "\n\n".join(" ".join(rng.choice(_WORDS) for _ in range(120)) + "." for _ in range(5))
    cfg = experiment_config(tmp_path, doc=doc, rag={"chunk_size": 128, "chunk_overlap": 0,
                                                    "initial_instructions": ["Answer the question."]},
                            optimizer={"steps": 1, "candidates_per_step": 2, "minibatch_size": 3, "pruner": "none",
                                       "finalists": 1},
                            models={"generator": {"backend": "scripted", "model": "generator"}})
    cfg["data"] = {"docs": ["docs"], "questions_per_chunk": 2,
                   "split": {"exemplar": 2, "optimization": 3, "validation": 8, "heldout": 4, "seed": 1}}
    config = write_toml(cfg, tmp_path / "exp.toml")
    done = CliRunner().invoke(app, ["optimize", str(config), "--no-progress"])
    assert done.exit_code == 0, done.output
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    looks = summary["validation"]["looks"]
    extension = looks[-1]["n"] - plan["confirmation_questions"]
    assert [x["decision"] for x in looks[:-1]] == ["continue"] * 3 and extension > 0  # the extension look
    for r in plan["roles"]:
        u = summary["usage"].get(r["role"]) or {}
        made = u.get("calls", 0) + u.get("cache_hits", 0)
        # What check() and `plan vs run` take as the most (a plan without calls_max: its validation's most).
        most = r.get("calls_max") or (r["search_calls"] + r["generation_calls"]
                                      + max(r["validation_calls"], r["validation_calls_max"]))
        assert made <= most, (r["role"], made, most)
    assert extension <= plan["extension_questions"]
    assert extension > plan.get("extension_expected", 0)  # more than the plan expected: the bound was needed
    assert "within the most planned" in done.output


def test_plan_vs_run_counts_this_runs_calls_not_the_studys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 61: `plan vs run` counted the study's calls across runs ("made 292" for a rerun that made 136)."""
    monkeypatch.setattr(opro.experiment, "ModelPool", lambda: scripted_pool())
    monkeypatch.setenv("COLUMNS", "200")
    config = write_toml(experiment_config(tmp_path, optimizer={"steps": 1, "candidates_per_step": 2,
                                                               "minibatch_size": 2, "pruner": "none"}),
                        tmp_path / "exp.toml")
    first = CliRunner().invoke(app, ["optimize", str(config), "--no-progress"])
    assert first.exit_code == 0, first.output
    usage = json.loads((tmp_path / "out" / "summary.json").read_text())["usage"]
    made = sum(u["calls"] + u["cache_hits"] for u in usage.values())
    assert made > 0 and f"calls planned, {made} made" in first.output
    rerun = CliRunner().invoke(app, ["optimize", str(config), "--no-progress"])  # the study is done: asks nothing
    assert rerun.exit_code == 0, rerun.output
    assert "calls planned, 0 made" in rerun.output and f"calls planned, {made} made" not in rerun.output
