"""How the commands show their results: rich tables of optimize's result (initial, finalists, winner)
and usage by role, and the lines of evaluate and compare."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from opro.cli._common import _listing, say

if TYPE_CHECKING:
    from opro.llm import UsageByRole
    from opro.search import CandidateRecord, FinalistRecord, OptimizationResult
    from opro.workflows.compare import ComparisonRun
    from opro.workflows.evaluate import PromptEvaluated
    from opro.workflows.optimize import OptimizeRun


def _versus_initial(f: FinalistRecord) -> str:
    """A finalist's cell in the "vs initial" column: only the chosen one was tested (its p on a second line)."""
    from opro.stats.sequential import interval_text

    if not f.chosen:
        return "not chosen" + (f"\n(selection {f.selection_score:.2f})" if f.selection_score is not None else "")
    if f.difference is None:
        return "n/a"
    if f.difference_ci is None or f.p_value is None:
        return f"{f.difference:+.2f}"
    return f"{f.difference:+.2f} [{interval_text(*f.difference_ci)}]\n(p={f.p_value:.2g})"



def _result_table(result: OptimizationResult, *, title: str, n_optimization: int) -> tuple[Any, Any]:
    """Initial, finalists and the returned instruction: search score beside validation score, one
    numbered row each, the caption saying what each score is measured on; and the instructions, listed
    by those numbers (:func:`_listing`)."""
    from rich.table import Table

    v = result.validation
    basis = f"search score: mean on the {n_optimization} optimization questions, which the search selected on"
    if v is not None:
        basis += f"; validation score: on {v.n_questions} validation questions it never used"
    table = Table(title=title, caption=f"* returned. {basis}", caption_justify="left")
    table.add_column("#", no_wrap=True)
    table.add_column("search score\n(in-sample)", justify="right")
    table.add_column("validation score\n[95% CI]", justify="right")
    table.add_column("vs initial\n(sequential p)", justify="right")

    def fmt(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.2f}"

    def with_ci(x: float | None, ci: tuple[float, float] | None) -> str:
        return fmt(x) + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")

    records = {r.name: r for r in result.history}
    texts: list[tuple[str, str]] = []

    def numbered(what: str, name: str, *, returned: bool) -> str:
        """``#n what`` (``*``: the returned one); the candidate's instruction, and with [search.space]
        open its configuration's values, go to the listing under ``#n``."""
        r = records.get(name)
        instruction, values = (r.instruction, r.params) if r is not None else (name, {})
        number = f"#{len(texts) + 1}"
        texts.append((number, instruction + (f"\n[{', '.join(f'{k} {v}' for k, v in values.items())}]" if values else "")))
        return f"{number} {what}" + (" *" if returned else "")

    if v is None:
        table.add_row(numbered("initial", result.initial_instruction, returned=False), fmt(result.initial_score), "-", "-")
        table.add_row(numbered("best (search)", result.best_name, returned=True), fmt(result.best_search_score),
                      "-", "not validated")
        return table, _listing(texts)
    table.add_row(numbered("initial", result.initial_instruction, returned=not result.validated), fmt(result.initial_score),
                  with_ci(v.initial_score, v.initial_ci), "", style="bold" if not result.validated else None)
    for i, f in enumerate(v.finalists, start=1):
        returned = v.winner is not None and f.instruction == v.winner.instruction
        table.add_row(numbered(f"finalist {i}", f.instruction, returned=returned), fmt(f.search_score),
                      with_ci(f.validation_score, f.validation_ci), _versus_initial(f),
                      style="bold" if returned else None)
    return table, _listing(texts)


def _candidates_table(result: OptimizationResult, *, measure: str) -> tuple[Any, Any]:
    """Under the cost objective: every candidate with its search score, its cost per answer and how
    it ended (pruned ones marked, with the questions they were asked; the front and the returned one
    named), numbered ``c1``...; and their names (instruction and settings), listed by those numbers."""
    from rich.table import Table

    from opro.search.results import quality_cost_front

    front = {r.trial_number for r in quality_cost_front(result.history)}
    initial = next((r for r in result.history if r.step == 0 and r.name == result.initial_instruction.strip()), None)
    base = initial.cost.cost if initial is not None and initial.cost is not None else None
    table = Table(title="candidates: search score and cost per answer", caption=f"cost: {measure}",
                  caption_justify="left")
    for col in ("#", "step", "search score\n(questions)", "cost per\nanswer", "vs initial", "status"):
        table.add_column(col, justify="left" if col in ("#", "status") else "right", no_wrap=col == "#")
    texts: list[tuple[str, str]] = []
    for i, r in enumerate(result.history, start=1):
        cost = "n/a" if r.cost is None else f"{r.cost.cost:,.3g}" if r.cost.unit != "tokens" else f"{r.cost.cost:,.0f}"
        versus = ("" if r is initial else "n/a" if r.cost is None or not base else f"{r.cost.cost / base - 1:+.0%}")
        asked = r.n_scored + r.n_invalid + r.n_errors
        status = (f"pruned after {asked} q" if r.status == "pruned" else r.status
                  if r.status != "complete" else "initial" if r is initial else "front" if r.trial_number in front
                  else "complete")
        if r.name == result.best_name and r.status == "complete":
            status += ", returned"
        score = "n/a" if r.score is None else f"{r.score:.2f} ({asked})"
        table.add_row(f"c{i}", str(r.step), score, cost, versus, status,
                      style="dim" if r.status == "pruned" else "bold" if r.name == result.best_name else None)
        texts.append((f"c{i}", r.name))
    return table, _listing(texts)


def _usage_table(usage: UsageByRole) -> Any:
    """Calls, cache hits, tokens and wall time per role."""
    from rich.table import Table

    table = Table(title="LLM usage by role")
    for col in ("role", "calls", "cache hits", "prompt tok", "completion tok", "wall s"):
        table.add_column(col, justify="right")
    for role, u in usage.items():
        table.add_row(role, str(u.get("calls", 0)), str(u.get("cache_hits", 0)), str(u.get("prompt_tokens", 0)),
                      str(u.get("completion_tokens", 0)), f"{u.get('wall_s', 0.0):.1f}")
    return table


def show_evaluation(console: Any, done: PromptEvaluated) -> None:
    """The prompt, its split and summary, where its per-question table went and its MLflow run."""
    from rich.markup import escape

    console.print(f"[bold]{escape(done.prompt.label)}[/] on the {done.split} split ({done.report.n} questions)")
    console.print(escape(done.report.summary()))
    console.print("per-question table: " + ", ".join(str(w) for w in done.written))
    for recorded in done.recorded:
        console.print(f"recorded: {recorded.where}", markup=False, soft_wrap=True)


def show_comparison(console: Any, done: ComparisonRun) -> None:
    """The comparison's tables and numbered prompts, its sentences, where it was saved and recorded,
    and the promotion's decision."""
    report, saved = done.report, done.saved
    for table in report.rich_tables():
        console.print(table)
    console.print(_listing(report.numbered_prompts()))
    console.print(report.multiplicity())
    for sentence in report.sentences():
        console.print(f"- {sentence}")
    if report.judge_noise:
        console.print(f"- {report.judge_noise}", markup=False, soft_wrap=True)
    console.print(f"reports: {saved.directory}  (report.md, report.json, scores.csv, comparison.png)")
    for recorded in saved.recorded:
        console.print(f"recorded: {recorded.where}", markup=False, soft_wrap=True)
    if saved.evaluation_run_ids:
        console.print(f"MLflow evaluation runs (one per prompt, per-question traces): {', '.join(saved.evaluation_run_ids)}")
    if done.decision is not None:
        console.print(done.decision.message(), markup=False, soft_wrap=True)


def show_optimization(console: Any, done: OptimizeRun) -> None:
    """The result table and its instructions, the search's figures and headline, the usage by role and
    the plan beside it."""
    from rich.markup import escape

    result = done.result
    table, instructions = _result_table(result, title=f"opro optimize: {done.config.experiment.name}",
                                        n_optimization=done.n_optimization)
    console.print(table)
    console.print(instructions)
    if result.objective.non_inferiority:
        for part in _candidates_table(result, measure=done.config.cost_model().measure):
            console.print(part)
    n_pruned = sum(1 for r in result.history if r.status == "pruned")
    n_failed = sum(1 for r in result.history if r.status == "failed")
    console.print(
        f"{len(result.history)} candidates ({n_pruned} pruned{f', {n_failed} failed' if n_failed else ''}), stopped by "
        f"{result.stopped_reason}, {result.wall_s:.0f}s; search scores on {done.n_optimization} optimization questions"
    )
    if n_failed:
        say(console, f"warning: {failed_line(result.history)}")
    console.print(escape(result.headline()))
    if result.judge_noise:
        say(console, result.judge_noise)  # summary.json says it too, beside the gain
    if done.shortfall:
        console.print(f"[yellow]warning:[/] {escape(done.shortfall)}")
    console.print(_usage_table(result.usage))
    if done.plan_check:
        say(console, "\n".join(done.plan_check))
    if done.probe_saving is not None:
        say(console, done.probe_saving.line())


def failed_line(history: Sequence[CandidateRecord]) -> str:
    """What the failed candidates of ``history`` say: how many, the searched values every one of whose
    candidates failed (a model that stopped answering mid-run, never a value dropped unsaid), and that a
    rerun asks them again."""
    failed = [r for r in history if r.status == "failed"]
    outcomes: dict[tuple[str, Any], list[bool]] = {}
    for r in history:
        for name, value in r.params.items():
            outcomes.setdefault((name, value), []).append(r.status == "failed")
    dead = [f"{name}={value}" for (name, value), failed_too in outcomes.items() if all(failed_too)]
    where = f": every candidate with {', '.join(dead)} failed (see the warnings above)" if dead else " (see the warnings above)"
    return (f"{len(failed)} of {len(history)} candidates failed{where}; they are not in the search's choice, and "
            "a rerun of the same command asks them again")


def show_no_proposal(console: Any, done: OptimizeRun) -> None:
    """The error of a search whose optimizer proposed no usable instruction, with its reasons."""
    from rich.markup import escape

    result, steps = done.result, done.config.optimizer.steps
    reasons = sorted({r["reason"] for r in result.rejected}) or ["the optimizer returned nothing"]
    console.print(
        f"[red]error:[/red] the optimizer proposed no usable instruction in {steps} step(s) "
        f"({len(result.rejected)} rejected: {escape('; '.join(reasons))}); "
        + escape("check [models.optimizer] (a stronger model) or [optimizer].max_instruction_chars"),
        soft_wrap=True,
    )


def show_outputs(console: Any, done: OptimizeRun) -> None:
    """Where worker 0's outputs are, where each tracker recorded the run, and its registered prompt."""
    result, cfg = done.result, done.config
    say(console, f"outputs: {cfg.output_dir}  ({', '.join(done.outputs)})")
    say(console, "\n".join(f"recorded: {r.where}" for r in result.recorded))
    if cfg.tracking.register_prompt:
        from opro.tracking.recorder import INITIAL_NOTE

        note = f" (the {INITIAL_NOTE})" if result.returned_is_initial else ""
        say(console, f"registered: prompts:/{cfg.prompt_name}@{cfg.tracking.prompt_alias}{note}")
