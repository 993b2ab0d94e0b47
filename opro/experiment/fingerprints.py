"""What defines a run and what changes its scores, read from an experiment's config and the values it
built: the run's params (for MLflow), the prepared dataset's marker, the settings a score depends on
and the study's fingerprint (stored with the study, so a resume never mixes settings)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opro.hashing import sha
from opro.llm import ROLES
from opro.program.choices import in_play
from opro.redaction import redact

if TYPE_CHECKING:
    from opro.config import OproConfig
    from opro.data.dataset import GoldenDataset
    from opro.judges.templates import JudgeTemplate
    from opro.search.space import SearchSpace

#: The fingerprint entries the paired noise of two prompts depends on (:func:`noise_digest`).
NOISE_ENTRIES = ("dataset.hash", "split", "models.task.", "models.judge.", "judge.")
#: Model settings that never change a score, left out of the study fingerprint (the model's name stays).
UNSCORED_SPEC_KEYS = ("max_concurrency", "timeout_s", "max_retries", "prefix_cache_mb", "draft_fill", "base_url")


def dataset_fingerprint(config: OproConfig, *, paraphrases: str | None) -> str:
    """What the prepared dataset (``<output_dir>/dataset``) depends on; ``paraphrases``: the configured
    embedder's identity (paraphrases are kept in one split where embeddings are configured)."""
    d = config.data
    blob = json.dumps(
        {
            "docs": list(d.docs),
            "dataset": d.dataset,
            "fields": [d.query_field, d.answer_field, d.contexts_field],
            "questions_per_chunk": d.questions_per_chunk,
            "max_chunks": d.max_chunks,
            "split": [d.split.exemplar, d.split.optimization, d.split.heldout, d.split.seed]
            + ([d.split.validation] if d.split.validation else []),
            "chunking": [config.rag.chunk_size, config.rag.chunk_overlap],
            **({"not_in_context": d.not_in_context} if d.not_in_context else {}),
            "generator": config.models.generator.safe_dict() if not d.dataset else None,
            **({"paraphrases": paraphrases} if paraphrases is not None else {}),
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def run_params(config: OproConfig, *, dataset: GoldenDataset) -> dict[str, Any]:
    """Everything that defines the run, for MLflow (never secrets: specs carry env var names only)."""
    cfg, ds = config, dataset
    params: dict[str, Any] = {"config": cfg.source, "seed": cfg.experiment.seed}
    for role in ROLES:
        for k, v in getattr(cfg.models, role).safe_dict().items():
            params[f"models.{role}.{k}"] = v
    assert ds.split is not None
    params["dataset.hash"] = ds.content_hash
    params["dataset.size"] = len(ds)
    for name, n in ds.split.sizes.items():
        params[f"split.{name}"] = n
    params["split.seed"] = cfg.data.split.seed
    for section in ("rag", "judge", "optimizer"):
        for k, v in vars(getattr(cfg, section)).items():
            if k != "embeddings":
                params[f"{section}.{k}"] = v
    for k, v in cfg.search.space.params().items():
        if v:  # an empty list: that dimension is not searched
            params[f"search.space.{k}"] = v
    return params


def score_settings(config: OproConfig, *, dataset: GoldenDataset, judge: JudgeTemplate,
                   program: Mapping[str, Any] | None) -> dict[str, str]:
    """The fingerprint but the search space (which bootstrapping its demonstrations would answer):
    ``judge`` is the template the judge reads, ``program`` what the user's program says of itself
    (None: opro's own program)."""
    cfg, ds = config, dataset
    assert ds.split is not None
    out: dict[str, str] = {
        "dataset.hash": ds.content_hash,
        "split": hashlib.sha256(json.dumps(ds.split.to_json(), sort_keys=True).encode()).hexdigest()[:16],
        "seed": str(cfg.experiment.seed),
    }
    for role in ("task", "judge", "optimizer"):
        for k, v in redact(getattr(cfg.models, role).safe_dict()).items():
            # Speed, not scores (saved prefixes and drafted tokens leave greedy answers as they were,
            # up to floating-point sums), so a study resumes across them; and where the model is
            # served, not which model: the same model on another port or host resumes.
            if k not in UNSCORED_SPEC_KEYS:
                out[f"models.{role}.{k}"] = str(v)
    out.update({f"models.task_model.{n}": json.dumps({k: v for k, v in redact(s.safe_dict()).items() if k not in
                UNSCORED_SPEC_KEYS}, sort_keys=True, default=str)  # the searched task models' tables, one each
                for n, s in in_play(cfg).items() if s != cfg.models.task})
    for section in ("rag", "judge"):
        for k, v in vars(getattr(cfg, section)).items():
            if (k, v) not in (("paired", "pointwise"), ("both_orders", False)):  # defaults: older studies resume
                out[f"{section}.{k}"] = str(redact(v) if not hasattr(v, "__dataclass_fields__") else redact(vars(v)))
    # What the judge reads, not only where it comes from: an edited template file (or another
    # LlamaIndex's built-in text) scores differently, so it must not resume the study.
    content = json.dumps([judge.system, judge.user, judge.output_format])
    out["judge.template_sha256"] = hashlib.sha256(content.encode("utf-8")).hexdigest()[:16]
    if program is not None:  # absent for opro's: old studies resume
        out["program"] = json.dumps(program, sort_keys=True, default=str)
    return out


def fingerprint(settings: Mapping[str, str], *, space: SearchSpace | None) -> dict[str, str]:
    """Everything that changes a score (the :func:`score_settings` and the search space), stored with the
    study so a resume never mixes settings."""
    out = dict(settings)
    if space is not None:  # absent otherwise: studies from before the space still resume
        out["search.space"] = json.dumps(space.describe(), sort_keys=True)
    return out


def noise_digest(fingerprint: Mapping[str, str]) -> str:
    """The digest of the entries of a study fingerprint (:meth:`opro.experiment.Experiment.fingerprint`)
    that the paired noise depends on: the dataset's content hash, the split, the task and judge models,
    the judge settings and its template. A probe and a run's ``summary.json`` keep it; a plan takes their
    noise only where it is this config's."""
    kept = {k: v for k, v in fingerprint.items() if k.startswith(NOISE_ENTRIES)}
    return sha(json.dumps(kept, sort_keys=True))


__all__ = ["NOISE_ENTRIES", "UNSCORED_SPEC_KEYS", "dataset_fingerprint", "fingerprint", "noise_digest", "run_params", "score_settings"]
