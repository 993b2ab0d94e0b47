"""The child processes tests start, as functions: ``python tests/children.py NAME ARG...`` runs
``NAME(*ARGS)`` in a fresh interpreter (:func:`argv` builds that command line; the arguments arrive as
strings). A test starts a child only where what it proves needs another process: a native crash, a
process killed, processes racing, or the modules a fresh interpreter imports.

Running this file puts ``tests/`` first on ``sys.path``, and it adds ``experiments/`` as pytest's
``pythonpath`` does, so a child imports the shared doubles (``fakes``, ``fault_server``) as the tests do."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(1, str(HERE.parent / "experiments"))


def argv(name: str, *args: object) -> list[str]:
    """The command line that runs ``name(*args)`` here in a child process."""
    if not callable(globals().get(name)) or name.startswith("_") or name in ("argv", "main"):
        raise ValueError(f"no child named {name!r} in {__file__}")
    return [sys.executable, str(HERE / "children.py"), name, *map(str, args)]


# -- the embedded engine's start-up probe (conftest.fake_child) ------------------------------------------


def fake_probe(path: str, mode: str) -> None:
    """A stand-in for the probe's child (``python -m opro.llm.probe PATH MODE``): crashes with a real
    SIGSEGV in the modes listed in ``$CRASH``, answers in the others, and counts its runs in ``$RUNS``."""
    import faulthandler

    with open(os.environ["RUNS"], "a") as fh:
        fh.write(mode + "\n")
    if mode in os.environ["CRASH"].split(","):
        print("load_tensors:   AMX model buffer size =   950.71 MiB", file=sys.stderr, flush=True)
        faulthandler.disable()
        faulthandler._sigsegv()  # type: ignore[attr-defined]
    print("load_tensors:   CPU_Mapped model buffer size =   950.71 MiB", file=sys.stderr)


def extra_buffers_decode(name: str, mode: str) -> None:
    """Loads embedded model ``name`` with extra buffers ``mode`` (no start-up probe), prints the setting
    llama.cpp was given, then decodes: on some CPUs (AMX) extra buffers crash at the first decode."""
    from opro.llm import GenerationOptions, Message
    from opro.llm.llamacpp import LlamaCppLLM
    from opro.llm.packs import model_path

    llm = LlamaCppLLM(model_path=model_path(name), extra_buffers=mode, probe=False, n_ctx=512, batch_width=1)
    print(f"use_extra_bufts={llm.load().model_params.use_extra_bufts}", flush=True)
    reply = llm.generate((Message("user", "Say yes."),), GenerationOptions(temperature=0.0, max_tokens=2))
    print(f"completion_tokens={reply.completion_tokens}", flush=True)
    llm.close()


# -- the OPRO loop, killed and resumed (test_loop) -----------------------------------------------------


def keyword_search(folder: str, judge_delay_s: str) -> None:
    """The keyword-world search (:func:`fakes.keyword_optimizer`) recording into ``folder`` with its call
    cache there, each judge call ``judge_delay_s`` slower; prints the backend calls per model
    (``CALLS task judge optimizer``) and the result (``BEST score candidates``)."""
    import time

    from fakes import Ex, keyword_examples, keyword_judge_reply, keyword_optimizer

    from opro.llm import GenerationOptions, Message
    from opro.llm.cache import CallCache

    delay = float(judge_delay_s)

    def slow_judge(messages: tuple[Message, ...], options: GenerationOptions) -> str:
        time.sleep(delay)
        return keyword_judge_reply(messages, options)

    tmp = Path(folder)
    opt, rig, program = keyword_optimizer(tmp, cache=CallCache(tmp / "calls.sqlite"), judge_reply=slow_judge)
    result = opt.optimize(program=program, optimization_set=keyword_examples(4),  # type: ignore[arg-type]
                          exemplar_set=[Ex("q", "ref1")], initial_instructions=["Answer."])
    print("CALLS", len(rig.task.calls), len(rig.judge.calls), len(rig.optimizer.calls))
    print("BEST", result.best_score, len(result.history))


# -- processes racing for one MLflow store (test_faults) ---------------------------------------------------


def mlflow_run(tracking_uri: str, experiment: str) -> None:
    """One MLflow run in experiment ``experiment`` of the store at ``tracking_uri``, created if missing."""
    from opro.tracking import MlflowTracker

    tracker = MlflowTracker(tracking_uri=tracking_uri, experiment_name=experiment)
    tracker.start(run_name="r", params={})
    tracker.finish()


# -- what a fresh interpreter imports (test_genai, test_openai_backend) ------------------------------------


def record_evaluation(tracking_uri: str) -> None:
    """Records an evaluation of 3 held-out questions as MLflow GenAI records at ``tracking_uri``; prints
    whether that imported litellm."""
    from opro.data.dataset import Example, GoldenDataset
    from opro.evaluation.batch import EvaluationReport, EvaluationRow
    from opro.program.prompts import QATemplate
    from opro.tracking.genai import GenAILogger, PromptEvaluation

    ds = GoldenDataset(tuple(Example(f"Question {i}?", f"Answer {i}.") for i in range(3))).with_split(
        exemplar=0, optimization=0, validation=0, heldout=3, seed=0)
    rows = tuple(EvaluationRow(query=e.query, reference=e.reference_answer, answer="a", score=4.0, passing=True)
                 for e in ds.examples)
    log = GenAILogger(tracking_uri=tracking_uri, experiment_name="l", dataset_prefix="l")
    record = log.log_evaluations([PromptEvaluation(label="p", template=QATemplate(instruction="Answer."),
                                                   report=EvaluationReport(rows=rows))],
                                 dataset=ds, split="heldout", source="test")
    assert len(record.runs[0].trace_ids) == 3, record
    print("litellm" in sys.modules and sys.modules["litellm"] is not None)


def openai_calls(key_env: str) -> None:
    """A call of the openai backend to the loopback server that succeeds, then one refused for its key
    (``$key_env`` holds the key the server takes); prints after each whether the ``openai`` SDK was imported."""
    from fault_server import FaultServer

    from opro.errors import LLMAuthError
    from opro.llm import GenerationOptions, Message
    from opro.llm.openai import OpenAILLM

    with FaultServer(key=os.environ[key_env], keep_alive=True) as server:
        llm = OpenAILLM(model="task-model", base_url=server.base_url, api_key_env=key_env, max_retries=0)
        llm.generate((Message("user", "hello"),), GenerationOptions(max_tokens=8))
        print("after success:", "openai" in sys.modules)
        server.faults["task"] = "401"
        try:
            llm.generate((Message("user", "again"),), GenerationOptions(max_tokens=8))
        except LLMAuthError:
            print("auth error mapped:", "openai" in sys.modules)


# -- the sidecar's tests (tests/tracking/test_sidecar.py) -------------------------------------------------


class Counter:
    """Lives in the sidecar's child: its state persists between calls (here, so that the tests and every
    child process import it by one name)."""

    def __init__(self, start: int = 0) -> None:
        self.value = start
        self.seen: list[int] = []

    def add(self, n: int, *, times: int = 1) -> int:
        self.value += n * times
        self.seen.append(n)
        return self.value

    def pid(self) -> int:
        return os.getpid()

    def fail(self, what: str) -> None:
        from opro.errors import DataError

        raise DataError(f"bad {what}")

    def unpicklable_failure(self) -> None:
        class Local(Exception):  # cannot be pickled back to the parent
            pass

        raise Local("local trouble at https://user:sk-secret-99@example.com/")

    def die(self) -> None:
        os._exit(3)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def unpicklable_result(self) -> object:
        return lambda: None



def sidecar_parent_killed() -> None:
    """Starts a sidecar, prints its process id, then kills this process (SIGKILL): no clean-up runs."""
    import signal

    from children import Counter  # by its module's name: this file runs as __main__, which the child lacks

    from opro.tracking.sidecar import Sidecar

    car = Sidecar(name="s")
    car.host("a", Counter)
    print(car.call("a", "pid"), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def sidecar_parent_killed_mid_call() -> None:
    """Starts a sidecar, prints its process id, sets it on a two-minute call and kills this process
    (SIGKILL) while the call runs: the pipe's end of file would only reach the child after it."""
    import signal
    import threading
    import time

    from children import Counter  # by its module's name: this file runs as __main__, which the child lacks

    from opro.tracking.sidecar import Sidecar

    car = Sidecar(name="s")
    car.host("a", Counter)
    print(car.call("a", "pid"), flush=True)
    threading.Thread(target=car.call, args=("a", "sleep", 120.0), daemon=True).start()
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)


# -- the CLI as a user runs it, on scripted models (test_genai) -------------------------------------------


def cli_on_scripted_models(*args: str) -> None:
    """``opro ARGS`` through :func:`opro.cli.main` (which leaves through ``os._exit``, as a real
    command does), its experiments on :func:`fakes.scripted_pool`."""
    from fakes import scripted_pool

    import opro.experiment
    from opro.cli import main as opro_main

    opro.experiment.ModelPool = lambda: scripted_pool()  # type: ignore[assignment,misc]
    sys.argv = ["opro", *args]
    opro_main()


def cli_on_close_call_models(tied: str, *args: str) -> None:
    """:func:`cli_on_scripted_models` with a judge that gives an answer from the context 5 and any other
    answer 2, except on the questions listed (one a line) in the file ``tied``, where every answer
    gets 2: a finalist ahead on the questions left out, tied on the others (test_genai)."""
    from pathlib import Path

    from fakes import judge_reply, optimizer_reply, task_reply

    import opro.experiment
    from opro.llm import GenerationOptions, Message
    from opro.llm.pool import ModelPool
    from opro.llm.scripted import ScriptedLLM

    ties = [q for q in Path(tied).read_text().splitlines() if q]

    def judge(messages: tuple[Message, ...], options: GenerationOptions) -> str:
        text = messages[-1].content
        if any(q in text for q in ties):
            return '{"score": 2, "reasoning": "tied"}'
        return judge_reply(messages, options)

    def pool() -> ModelPool:
        return ModelPool(scripted={"task": ScriptedLLM(default=task_reply, model="task"),
                                   "judge": ScriptedLLM(default=judge, model="judge"),
                                   "optimizer": ScriptedLLM(default=optimizer_reply, model="optimizer")})

    opro.experiment.ModelPool = pool  # type: ignore[assignment,misc]
    sys.argv = ["opro", *args]
    from opro.cli import main as opro_main

    opro_main()


def main(args: list[str]) -> None:
    name, *rest = args
    argv(name)  # a known child
    globals()[name](*rest)


if __name__ == "__main__":
    main(sys.argv[1:])
