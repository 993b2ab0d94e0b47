"""The front door stays true: every config key is documented, every README `opro` command runs as written, and
every file a command in the README or docs/ names exists or is written by a command shown before it."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

ROOT = Path(__file__).parents[1]


def _keys(cls: type) -> set[str]:
    from opro.config import SpaceSection
    from opro.program.dimensions import names

    keys = {f.name for f in dataclasses.fields(cls) if f.name not in ("base_dir", "source") and f.metadata.get("toml", True)}
    return keys | set(names()) if cls is SpaceSection else keys  # [search.space]: a key per dimension of the table


def test_configuration_reference_lists_every_key() -> None:
    from opro.config import (
        DataSection,
        EmbeddingsSection,
        ExperimentSection,
        JudgeSection,
        OptimizerSection,
        ProgramSection,
        RAGSection,
        SpaceSection,
        SplitSection,
        TrackingSection,
    )
    from opro.llm.pool import ModelSpec

    doc = (ROOT / "docs" / "configuration.md").read_text()
    sections = re.split(r"^#+ ", doc, flags=re.M)
    tables = {
        "[experiment]": ExperimentSection, "[data]": DataSection, "[data.split]": SplitSection, "[rag]": RAGSection,
        "[rag.embeddings]": EmbeddingsSection, "[models.task]": ModelSpec, "[judge]": JudgeSection,
        "[optimizer]": OptimizerSection, "[search.space]": SpaceSection, "[tracking]": TrackingSection,
        "[program]": ProgramSection,
    }
    for table, cls in tables.items():
        body = next(s for s in sections if s.startswith(f"`{table}`"))
        documented = set(re.findall(r"^\| `(\w+)` \|", body, flags=re.M))
        wanted = _keys(cls) - {"split", "embeddings"}
        assert wanted == documented, (table, wanted ^ documented)
        for f in dataclasses.fields(cls):
            if f.name in documented and isinstance(f.default, bool | int | float) and not isinstance(f.default, bool):
                assert re.search(rf"^\| `{f.name}` \| `{f.default!r}` \|", body, flags=re.M), (table, f.name)


#: The README and the guide's pages that walk through the quickstart's run folder, in reading order: the
#: commands they show run one after the other on the quickstart's layout.
GUIDE = ("README.md", "docs/quickstart.md", "docs/data.md", "docs/mlflow.md")


def _readme_commands() -> list[str]:
    commands: list[str] = []
    for page in GUIDE:
        for block in re.findall(r"```bash\n(.*?)```", (ROOT / page).read_text(), flags=re.S):
            for line in block.splitlines():
                line = line.strip()
                if line.startswith("opro ") and line not in commands:  # a page repeats the README's commands
                    commands.append(line)
    return commands


def test_readme_commands_run_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fakes import scripted_pool, write_config

    from opro.cli import app

    commands = _readme_commands()
    assert any(c.startswith("opro compare") for c in commands) and any("--alias production" in c for c in commands)
    # The quickstart's layout (experiments/quickstart.toml -> runs/quickstart), on scripted models.
    config = write_config(tmp_path / "experiments", name="quickstart", out="../runs/quickstart")
    config.write_text(config.read_text().replace('prompt_name = "qa-quickstart"', ""))  # the default name
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("opro.experiment.ModelPool", scripted_pool)
    monkeypatch.setenv("COLUMNS", "200")
    runner = CliRunner()
    ran = 0
    for line in commands:
        args = shlex.split(line, comments=True)[1:]
        redirect = None
        if ">" in args:
            redirect = tmp_path / args[args.index(">") + 1]
            args = args[: args.index(">")]
        if args[0] in ("models", "doctor") or "experiments/shared.toml" in args:
            continue  # model packs (test_models) and the real engine (doctor); scaling out needs shared servers
        if any("://" in a for a in args):  # a judge on a server that is not here: what it reads was written, though
            assert all((tmp_path / a).is_file() for a in args if a.endswith((".csv", ".json", ".toml"))), line
            continue
        if args[0] == "ui":  # a server that runs until stopped: test_ui serves it; here, what it starts
            started: list[list[str]] = []

            class Server:  # a server that exits at once, having been started with argv
                stdout = None

                def __init__(self, argv: list[str], started: list[list[str]] = started, **_: object) -> None:
                    started.append(argv)

                def wait(self, timeout: float | None = None) -> int:
                    return 0

                poll = wait

            with monkeypatch.context() as m:
                m.setattr("subprocess.Popen", Server)
                result = runner.invoke(app, args)
            assert result.exit_code == 0, f"{line}\n{result.output}"
            assert started[0][started[0].index("--backend-store-uri") + 1].endswith("runs/quickstart/mlflow.db")
            ran += 1
            continue
        result = runner.invoke(app, args)
        assert result.exit_code == 0, f"{line}\n{result.output}"
        ran += 1
        if redirect is not None:
            redirect.write_text(result.stdout)
            assert "{context_str}" in redirect.read_text()
    assert ran >= 9
    exported = tmp_path / "runs" / "quickstart" / "export"  # every export of the README stays in the run's folder
    assert {"prompt.dspy.json", "quickstart.json", "prompt.llamaindex.json", "tuned_prompt.txt"} <= {
        p.name for p in exported.iterdir()}
    assert not {"exported", "tuned_prompt.txt"} & {p.name for p in tmp_path.iterdir()}  # nothing in the root
    assert (tmp_path / "runs" / "quickstart" / "compare" / "two-prompts" / "report.md").is_file()
    assert (tmp_path / "runs" / "quickstart" / "evaluate" / "heldout-run.csv").is_file()  # what judge agreement reads


# ---- every path a shown command names exists, or a command shown before it writes it --------------------------

#: What a command-line argument must look like to be checked as a path.
_PATH_SUFFIXES = (".toml", ".json", ".jsonl", ".csv", ".txt", ".pdf", ".py")
_PATH_FOLDERS = ("experiments/", "data/", "runs/", "exported/", "docs/", "tests/", "notebooks/")
#: A path component in capitals stands for the reader's own path (CONFIG.toml, DIR, A/...).
_PLACEHOLDER = re.compile(r"(^|/)[A-Z][A-Z_]*(\.|/|$)")
#: How a shown command starts: `opro ...`, or a script or module run by Python; `VAR=value` prefixes allowed.
_COMMAND = re.compile(r"^(?:[A-Z_]+=\S+\s+)*(opro|python3?)\s")


def _doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _bash_lines(text: str) -> list[str]:
    """The lines of a Markdown text's ```bash blocks, in order (backslash continuations joined)."""
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [line.strip() for block in blocks for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def _repository_files() -> set[str] | None:
    """The files of a fresh clone (tracked, or new and not ignored), so that local run outputs do not count."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT, capture_output=True, text=True, check=True, timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None  # not a git checkout: the files on disk
    return set(filter(None, listed.split("\0")))


def _in_repository(path: str, files: set[str] | None) -> bool:
    if files is None:
        return (ROOT / path).exists()
    return path in files or any(f.startswith(path + "/") for f in files)


def _norm(path: str) -> str:
    return os.path.normpath(path.removeprefix("file:").removeprefix("run:").split("::")[0])


def _option(args: list[str], name: str, default: str | None = None) -> str | None:
    return args[args.index(name) + 1] if name in args and args.index(name) + 1 < len(args) else default


def _named_paths(args: list[str]) -> list[str]:
    """The files and folders an `opro` command line reads (its outputs, `--out X` and `> X`, left out)."""
    named = []
    for i, arg in enumerate(args):
        if arg == ">" or (i and args[i - 1] in (">", "--out")) or "://" in arg:
            continue
        bare = arg.removeprefix("file:").removeprefix("run:").split("::")[0]
        if _PLACEHOLDER.search(bare):  # CONFIG.toml, A/judge_calibration/...: the reader's own path
            continue
        if bare.endswith(_PATH_SUFFIXES) or bare.startswith(_PATH_FOLDERS):
            named.append(_norm(bare))
    return named


def _prompt_kind(spec: str) -> str:
    """The kind `opro.export.sources.resolve_prompt` gives a spec: `opro evaluate` names its table after it."""
    if spec == "best" or spec.startswith("run:") or spec.endswith(".toml"):
        return "run"
    if spec == "initial" or spec.startswith("initial:"):
        return "initial"
    if spec.startswith("prompts:"):
        return "registry"
    return "file" if spec.startswith("file:") or (ROOT / spec).is_file() else "literal"


def _writes(args: list[str]) -> list[tuple[str, frozenset[str]]]:
    """What an `opro` command line writes: (path, the sub-folders of it that other commands write)."""
    from opro.config import load_config
    from opro.paths import CALIBRATION_DIR, CALIBRATION_FILE, COMPARE_DIR, EVALUATE_DIR, EXPORT_DIR

    written = [(_norm(out), frozenset()) for out in (_option(args, "--out"), _option(args, ">")) if out]
    config = next((a for a in args if a.endswith(".toml") and (ROOT / a).is_file()), None)
    if config is None:
        return written
    out = os.path.relpath(load_config(ROOT / config).output_dir, ROOT)
    command = " ".join(args[:2]) if args[0] == "judge" else args[0]
    if command == "optimize":
        written.append((out, frozenset({COMPARE_DIR, EVALUATE_DIR, EXPORT_DIR, CALIBRATION_DIR, CALIBRATION_FILE})))
    elif command == "compare":
        written.append((f"{out}/{COMPARE_DIR}", frozenset()))
    elif command == "export" and "--out" not in args:
        written.append((f"{out}/{EXPORT_DIR}", frozenset()))
    elif command == "evaluate" and "--out" not in args:
        stem = f"{out}/{EVALUATE_DIR}/{_option(args, '--split', 'heldout')}-{_prompt_kind(_option(args, '--prompt', 'initial') or '')}"
        written += [(stem + ".csv", frozenset()), (stem + ".json", frozenset())]
    elif command == "judge calibrate":
        written += [(f"{out}/{CALIBRATION_FILE}", frozenset()), (f"{out}/{CALIBRATION_DIR}", frozenset())]
    return written


def _written_before(path: str, written: list[tuple[str, frozenset[str]]]) -> bool:
    for root, others in written:
        if path == root:
            return True
        if path.startswith(root + "/") and path[len(root) + 1 :].split("/")[0] not in others:
            return True
    return False


def _shown_commands(text: str) -> list[str]:
    """The commands ``text`` shows, in order: the lines of its ```bash blocks and its inline code spans
    that start as a command does (`opro ...`, `python experiments/...`, `PYTHONPATH=$PWD python ...`)."""
    out = []
    for block, span in re.findall(r"```bash\n(.*?)```|`([^`\n]+)`", text, flags=re.S):
        lines = _bash_lines(f"```bash\n{block}```") if block else [span.strip()]
        out += [line for line in lines if _COMMAND.match(line)]
    return out


def unresolved_paths(text: str) -> list[str]:
    """Commands ``text`` shows that name a path nothing provides, with that path."""
    files = _repository_files()
    written: list[tuple[str, frozenset[str]]] = []
    problems = []
    for line in _shown_commands(text):
        try:
            args = shlex.split(line, comments=True)
        except ValueError:  # an unbalanced quote: not a command line after all
            continue
        while args and re.match(r"^[A-Z_]+=", args[0]):
            args = args[1:]
        if not args:
            continue
        problems += [f"{line}  ->  {p}" for p in _named_paths(args[1:])
                     if not _in_repository(p, files) and not _written_before(p, written)]
        if args[0] == "opro":
            written += _writes(args[1:])
    return problems


@pytest.mark.parametrize("doc", _doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_shown_commands_name_files_that_exist_or_are_written_before(doc: Path) -> None:
    assert unresolved_paths(doc.read_text()) == []


def test_the_path_check_catches_what_it_should() -> None:
    text = """```bash
opro optimize experiments/quickstart.toml
opro evaluate experiments/quickstart.toml --prompt best
opro judge agreement --answers runs/quickstart/evaluate/heldout-run.csv --labels runs/quickstart/evaluate/heldout-best.csv
opro optimize experiments/no-such.toml --worker 0/2
opro export best --config experiments/quickstart.toml --out exported/
opro dataset show exported/prompt.dspy.json
```
Inline too: `PYTHONPATH=$PWD python experiments/bench_nothing.py experiments/quickstart.toml`, and
`python -m pytest tests/test_docs.py::test_x`, but not `opro optimize CONFIG.toml`."""
    assert [p.split("  ->  ")[1] for p in unresolved_paths(text)] == [
        "runs/quickstart/evaluate/heldout-best.csv", "experiments/no-such.toml", "experiments/bench_nothing.py"
    ]
