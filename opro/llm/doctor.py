"""What the embedded engine finds on this machine (``opro doctor``): the CPU, the cores and threads, the
llama.cpp build, the model packs and, for each assembled model, the probe that picks its buffer types."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opro.errors import ModelPackError


@dataclass(frozen=True)
class ModelDiagnosis:
    """One embedded model: its pack state and, where assembled and probed, the extra-buffers mode that
    ``"auto"`` loads it with, the buffers llama.cpp reported, and each probe's outcome."""

    name: str
    state: str
    note: str
    mode: str | None = None
    buffers: tuple[str, ...] = ()
    probes: tuple[str, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class Diagnosis:
    cpu_model: str
    features: tuple[str, ...]
    cores: str
    busy_cores: float
    threads: int
    threads_why: str
    llama_cpp_python: str | None
    extra_buffers_switch: bool | None
    system_info: str
    models: tuple[ModelDiagnosis, ...]

    @property
    def ok(self) -> bool:
        return self.llama_cpp_python is not None and all(m.error is None for m in self.models)


def diagnose(*, probe: bool = True, refresh: bool = False) -> Diagnosis:
    """Look at the machine; with ``probe``, probe each assembled embedded model (from the record of an
    earlier probe where there is one, unless ``refresh``)."""
    from opro.llm.cpu import CpuLoad, CpuShare, cpu_info, usable_cores
    from opro.llm.packs import EMBEDDED_MODELS, list_models

    info = cpu_info()
    usable = usable_cores()
    load = CpuLoad(usable, window_s=0.5)
    import time

    time.sleep(0.5)
    busy = load.sample(force=True)
    choice = CpuShare(usable=usable, load=load).choose()
    llama_cpp: Any
    try:
        import llama_cpp
    except ImportError:
        llama_cpp = None
    version = None if llama_cpp is None else str(llama_cpp.__version__)
    switch = None
    system_info = "llama-cpp-python is not installed: pip install llama-cpp-python (or 'opro[local]')"
    if llama_cpp is not None:
        from opro.llm.probe import supports_extra_buffers_switch

        switch = supports_extra_buffers_switch()
        system_info = llama_cpp.llama_print_system_info().decode("utf-8", errors="replace").strip()
    models = []
    for status in list_models():
        if status.state != "assembled":
            note = (
                f"run `opro models pull {status.name}`" if status.state == "present"
                else f"missing {', '.join(status.missing_packages)}: pip install 'opro[local]'"
            )
            models.append(ModelDiagnosis(status.name, status.state, note))
            continue
        if not probe or llama_cpp is None:
            models.append(ModelDiagnosis(status.name, status.state, "ready (not probed)"))
            continue
        from opro.llm.probe import choose_extra_buffers
        from opro.llm.probe import probe as run_probe

        pack = EMBEDDED_MODELS[status.name]
        outcomes = []
        for mode in ("on", "off") if switch else ("on",):
            r = run_probe(status.path, pack.sha256, mode, refresh=refresh)
            outcomes.append(f"extra buffers {mode}: {'ok' if r.ok else r.detail} ({'recorded' if r.cached else f'{r.seconds:.1f} s'})")
        try:
            chosen = choose_extra_buffers(status.path, pack.sha256, "auto")
        except ModelPackError as exc:
            models.append(ModelDiagnosis(status.name, status.state, "cannot run here", probes=tuple(outcomes), error=str(exc)))
            continue
        models.append(
            ModelDiagnosis(status.name, status.state, "ready", chosen.mode, chosen.buffers, tuple(outcomes))
        )
    return Diagnosis(
        cpu_model=info.model,
        features=info.features,
        cores=usable.why(),
        busy_cores=busy,
        threads=choice.n_threads,
        threads_why=choice.why,
        llama_cpp_python=version,
        extra_buffers_switch=switch,
        system_info=system_info,
        models=tuple(models),
    )


def render(d: Diagnosis) -> str:
    """The diagnosis as plain text lines."""
    lines = [
        f"CPU: {d.cpu_model}",
        f"  features: {' '.join(d.features) or 'none of ' + 'avx2/avx512/amx'}",
        f"  AMX: {'yes' if 'amx_tile' in d.features else 'no'}",
        f"cores: {d.cores}; {d.busy_cores:.1f} busy with other processes now",
        f"threads (n_threads unset): {d.threads} now ({d.threads_why}); chosen again at every call",
        f"llama-cpp-python: {d.llama_cpp_python or 'not installed'}",
    ]
    if d.extra_buffers_switch is not None:
        lines.append(f"  extra-buffers switch (use_extra_bufts): {'yes' if d.extra_buffers_switch else 'no (this version has none)'}")
    lines.append(f"  llama.cpp system info: {d.system_info}")
    lines.append("embedded models:")
    for m in d.models:
        lines.append(f"  {m.name}: {m.state}, {m.note}")
        if m.mode is not None:
            lines.append(f"    extra buffers (auto): {m.mode}")
        for b in m.buffers:
            lines.append(f"    buffer: {b}")
        for p in m.probes:
            lines.append(f"    probe: {p}")
        if m.error:
            lines.append(f"    error: {m.error}")
    return "\n".join(lines)


__all__ = ["Diagnosis", "ModelDiagnosis", "diagnose", "render"]
