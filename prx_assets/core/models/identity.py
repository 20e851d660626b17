"""What a model is, independent of where it is read from: the part of a captioner, embedder or
text-encoder id that names the model.

- A hub name is the name, plus ``@revision`` when a revision is pinned (without one, the id says
  only which repository; pin a revision to tie it to its bytes).
- A local checkpoint folder is ``local:`` plus a digest of the files that decide what the model
  computes: its configs, weights, tokenizer and processor files (:data:`CHECKPOINT_FILES`), by
  their path inside the folder and their content. Copying or moving the folder, or the config
  folder that names it, changes nothing; replacing a weight or a tokenizer file changes the id.

Hashing weights costs a read of them (a 17 GB checkpoint: 10-30 s), so file digests are kept in a
cache keyed by the file's absolute path, size and modification time (``$PRX_CACHE_DIR``, default
``~/.cache/prx_assets``); a copy of a folder is hashed once where it lands.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import threading
from pathlib import Path

#: Files of a checkpoint folder that decide what the model computes (matched on the name).
CHECKPOINT_FILES = ("*.json", "*.safetensors", "*.bin", "*.pt", "*.pth", "*.model", "*.txt", "*.jinja",
                    "*.tiktoken", "*.py")
#: Files that match the patterns but decide nothing (download and training bookkeeping).
IGNORED_FILES = ("README*", "LICENSE*", "trainer_state.json", "training_args.bin", "*.lock", ".*")

_LOCK = threading.Lock()
_MEMO: dict[tuple[str, int, int], str] = {}
_CHUNK = 8 << 20


def looks_local(model: str) -> bool:
    """True when ``model`` is meant as a filesystem path rather than a hub id."""
    return model.startswith(("/", "./", "../", "~")) or os.path.isdir(os.path.expanduser(model))


def cache_dir() -> Path:
    """Where file digests are cached (``$PRX_CACHE_DIR``, default ``~/.cache/prx_assets``)."""
    return Path(os.environ.get("PRX_CACHE_DIR") or Path.home() / ".cache" / "prx_assets")


def _cache_file() -> Path:
    return cache_dir() / "file_digests.json"


def _load_cache() -> dict[str, list[object]]:
    try:
        data = json.loads(_cache_file().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _save_cache(entries: dict[str, list[object]]) -> None:
    """Merge ``entries`` into the cache file (atomic replace; a lost race loses only cache entries)."""
    path = _cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        merged = {k: v for k, v in _load_cache().items() if os.path.exists(k)}  # copies gone since: dropped
        merged.update(entries)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(merged, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: digests are computed again next time


def file_digest(path: Path) -> str:
    """sha256 of a file's content, cached by absolute path, size and modification time."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    with _LOCK:
        if key in _MEMO:
            return _MEMO[key]
    cached = _load_cache().get(key[0])
    if isinstance(cached, list) and len(cached) == 3 and cached[:2] == [st.st_size, st.st_mtime_ns]:
        digest = str(cached[2])
    else:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(_CHUNK):
                h.update(block)
        digest = h.hexdigest()
        _save_cache({key[0]: [st.st_size, st.st_mtime_ns, digest]})
    with _LOCK:
        _MEMO[key] = digest
    return digest


def checkpoint_files(folder: Path) -> list[Path]:
    """The files of a checkpoint folder that decide what it computes, sorted by their path in it."""
    out = []
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if not p.is_file() or any(part.startswith(".") for part in rel.split("/")):
            continue
        if any(fnmatch.fnmatch(p.name, pat) for pat in CHECKPOINT_FILES) and \
                not any(fnmatch.fnmatch(p.name, pat) for pat in IGNORED_FILES):
            out.append(p)
    return out


def model_identity(model: str, revision: str | None = None) -> str:
    """A machine-independent name for a model (see the module's docstring).

    >>> model_identity("Qwen/Qwen3-VL-8B-Instruct"), model_identity("Qwen/Qwen3-VL-8B-Instruct", "a1b2c3")
    ('Qwen/Qwen3-VL-8B-Instruct', 'Qwen/Qwen3-VL-8B-Instruct@a1b2c3')

    Raises
    ------
    FileNotFoundError
        For a local path that is not a folder holding checkpoint files.
    """
    if not looks_local(model):
        return f"{model}@{revision}" if revision else model
    folder = Path(model).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(f"model folder {str(folder)!r} does not exist")
    files = checkpoint_files(folder)
    if not files:
        raise FileNotFoundError(f"model folder {str(folder)!r} holds no checkpoint files ({', '.join(CHECKPOINT_FILES)})")
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.relative_to(folder).as_posix()}\0{file_digest(f)}\n".encode())
    return f"local:{h.hexdigest()[:16]}"


def hub_kwargs(model: str, revision: str | None) -> dict[str, str]:
    """``from_pretrained`` keyword arguments that pin a hub model's revision (none for a local folder)."""
    return {"revision": revision} if revision and not looks_local(model) else {}
