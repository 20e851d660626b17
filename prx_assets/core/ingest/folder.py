"""Folder sources: a local or shared-filesystem folder, listed recursively, filtered by extension.

Every file under the folder is accounted for, whatever its name or kind:

- A name that is not valid UTF-8 (Linux allows any bytes) cannot be stored as Arrow text as it
  is. Its key keeps its bytes percent-escaped (``bad_%FF%FE.jpg``): reversible, and unchanged for
  every name that is valid UTF-8 (:func:`key_of_name`, :func:`path_of_key`).
- A link is resolved when read. One leading out of the folder is refused (``outside_source``)
  unless the source sets ``follow_links``; that holds for a file link and for every file under a
  directory link, each of which is listed and rejected with its reason, so none goes missing
  from the accounting. A directory link inside the folder is not followed (its files are listed
  where they are).
"""

from __future__ import annotations

import functools
import os
import stat
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from prx_assets.core.ingest.sources import SourceItem, SourceReader, Unit
from prx_assets.errors import ConfigError

#: Characters left as they are when an undecodable name's bytes are escaped (besides letters and digits).
_SAFE = "/ !$&'()*+,;=:@~-._[]{}#^"


def key_of_name(rel: str) -> str:
    """A relative path as a key: itself when it is valid UTF-8, else its bytes percent-escaped
    (``%`` included, so the escape is reversible).

    >>> key_of_name("people/a b.jpg"), key_of_name(os.fsdecode(b"bad_\\xff\\xfe.jpg"))
    ('people/a b.jpg', 'bad_%FF%FE.jpg')
    """
    try:
        rel.encode("utf-8")
        return rel
    except UnicodeEncodeError:
        return urllib.parse.quote(os.fsencode(rel), safe=_SAFE)


def path_of_key(root: Path, key: str) -> Path:
    """The file a key names under ``root``: the key as a path when that exists, else (a name that was
    not valid UTF-8) the path its escaped bytes spell."""
    path = root / key
    if "%" not in key or os.path.lexists(path):
        return path
    raw = urllib.parse.unquote_to_bytes(key)
    return Path(os.fsdecode(os.path.join(os.fsencode(root), raw)))


def _entry_unit(key: str, path: Path) -> Unit:
    """A folder entry as a unit, stat-ed through links; a broken link (or loop) by the link itself."""
    try:
        st = path.stat()
    except OSError:
        st = path.lstat()
    return Unit(key=key, size=st.st_size, stamp=str(st.st_mtime_ns))


class FolderReader(SourceReader):
    """A local or shared-filesystem folder (recursive, extension filter; see the module's docstring)."""

    kind = "folder"

    def _root(self) -> Path:
        root = Path(self.config.location)
        if not root.is_dir():
            raise ConfigError(f"folder {str(root)!r} does not exist or is not a directory",
                              entry=f"source {self.config.name!r}",
                              fix="create the folder, mount the share, or fix 'path' in sources.yaml")
        return root

    def _linked_files(self, rel: str, path: Path) -> Iterator[tuple[str, Path]]:
        """The wanted files under a directory link leading out of the folder (listed to be rejected,
        or, with ``follow_links``, ingested), by their path through the link."""
        for dirpath, dirnames, filenames in os.walk(path, followlinks=self.config.follow_links):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            base = os.path.relpath(dirpath, path)
            for f in sorted(filenames):
                name = f"{rel}/{f}" if base == "." else f"{rel}/{Path(base).as_posix()}/{f}"
                if self._wants(name):
                    yield name, Path(dirpath) / f

    def _outside(self, path: Path) -> bool:
        """Whether a directory entry (a link) resolves to a place outside the folder."""
        try:
            return not path.resolve(strict=True).is_relative_to(self._real_root())
        except (OSError, RuntimeError):
            return False

    def _real_root(self) -> Path:
        real = self.__dict__.get("_real")
        if real is None:
            real = self.__dict__["_real"] = Path(self.config.location).resolve()
        return real

    def list_units(self, known_files: Mapping[str, str] | None = None) -> list[Unit]:
        root = self._root()
        pattern = "**/*" if self.config.recursive else "*"
        units: dict[str, Unit] = {}
        for p in root.glob(pattern):
            rel = p.relative_to(root).as_posix()
            if any(part.startswith(".") for part in rel.split("/")):
                continue
            if _dir_link(p):
                if self._outside(p):
                    for name, f in self._linked_files(rel, p):
                        units[key_of_name(name)] = _entry_unit(key_of_name(name), f)
                continue
            if p.is_dir() or not self._wants(rel):  # (glob does not descend into directory links)
                continue
            units[key_of_name(rel)] = _entry_unit(key_of_name(rel), p)
        return sorted(units.values(), key=lambda u: u.key)

    def list_new(self, known_files: Mapping[str, str],
                 state: Mapping[str, Any] | None) -> tuple[list[Unit], dict[str, Any] | None]:
        """New files only, skipping every folder whose mtime did not change since ``state`` (adding
        or removing a file changes its folder's mtime), and never stat-ing a known file: a drop
        costs the folders it touched, not the files that exist. Directory links are not descended
        into; one leading out of the folder has its files listed (see the module's docstring)."""
        root = self._root()
        previous = dict((state or {}).get("dirs", {}))
        now = time.time_ns()
        dirs: dict[str, list[Any]] = {}
        files: dict[str, Path] = {}
        stack = [""]
        while stack:
            rel = stack.pop()
            subdirs = self._scan(root, rel, previous, now, dirs, files)
            if self.config.recursive:
                stack.extend(subdirs)
        # One lookup for the files of every changed folder (a pass over the index, not a set of
        # every known file); only the new ones are stat-ed.
        among = getattr(known_files, "among", None)
        known = among(list(files)) if among is not None else {n for n in files if n in known_files}
        units = [_entry_unit(key, path) for key, path in files.items() if key not in known]
        return sorted(units, key=lambda u: u.key), {"dirs": dirs}

    def _scan(self, root: Path, rel: str, previous: dict[str, Any], now: int, dirs: dict[str, list[Any]],
              files: dict[str, Path]) -> list[str]:
        """One folder of :meth:`list_new`: its subfolders (from ``previous`` when its mtime is the
        same), its wanted files added to ``files`` by key, its entry recorded in ``dirs``."""
        path = root / rel if rel else root
        try:
            mtime = path.stat().st_mtime_ns
        except OSError:
            return []
        old = previous.get(rel)
        if old is not None and old[0] == mtime:
            subdirs = list(old[1])
        else:
            subdirs = []
            with os.scandir(path) as entries:
                for e in entries:
                    name = f"{rel}/{e.name}" if rel else e.name
                    if e.name.startswith("."):
                        continue
                    if e.is_dir(follow_symlinks=False):
                        subdirs.append(name)
                    elif _dir_link(e) and self._outside(Path(e.path)):
                        files.update((key_of_name(n), f) for n, f in self._linked_files(name, Path(e.path)))
                    elif self._wants(name) and not _dir_link(e):
                        files[key_of_name(name)] = Path(e.path)  # links and special files too: ingest says why
        # a folder modified in the last second may change again within its mtime's granularity
        dirs[rel] = [mtime if now - mtime > 1_000_000_000 else -1, subdirs]
        return subdirs

    def _sidecar_caption(self, path: Path) -> str | None:
        if not self.config.caption_field:
            return None
        side = path.with_suffix("." + self.config.caption_field.lstrip("."))
        try:
            return side.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            return None

    def read_unit(self, unit: Unit) -> Iterator[SourceItem]:
        path = path_of_key(Path(self.config.location), unit.key)
        uri = f"{self.config.location.rstrip('/')}/{unit.key}"
        problem = self._not_a_source_file(path)
        if problem is not None:
            yield SourceItem(key=unit.key, uri=uri, error=problem, license=self.config.license)
            return
        yield SourceItem(key=unit.key, uri=uri, fetch=path.read_bytes, caption=self._sidecar_caption(path),
                         license=self.config.license)

    def _not_a_source_file(self, path: Path) -> tuple[str, str] | None:
        """Why ``path`` is not read (a reject reason and message), or ``None`` for a regular file
        inside the source (links are resolved, the link's own and those of the folders above it;
        one leading out of the folder is refused unless ``follow_links``)."""
        try:  # a regular file in a folder of the source (nearly every file): one lstat, a cached resolve
            if stat.S_ISREG(os.lstat(path).st_mode) and (self.config.follow_links or self._inside(path.parent)):
                return None
        except OSError:
            pass  # named below, with the reason resolving it gives
        try:
            target = path.resolve(strict=True)
        except (OSError, RuntimeError) as e:  # dangling link, link loop, vanished file
            return "read_error", f"cannot resolve {os.fsencode(path)!r}: {e}"
        if not self.config.follow_links and not target.is_relative_to(self._real_root()):
            return ("outside_source", f"{_shown(path)} leads to {_shown(target)}, outside the source folder "
                    f"{self._real_root()}; set follow_links: true on the source to ingest what it points to")
        if not target.is_file():
            kind = "folder" if target.is_dir() else "FIFO, socket or device"
            return "not_a_file", f"{_shown(path)} is a {kind}, not a regular file"
        return None

    def _inside(self, folder: Path) -> bool:
        return _inside(str(folder), str(self._real_root()))

    def read_uri(self, uri: str) -> bytes:
        root = self.config.location.rstrip("/")
        if uri.startswith(root + "/"):
            return path_of_key(Path(root), uri[len(root) + 1:]).read_bytes()
        return Path(uri).read_bytes()


def _dir_link(entry: os.DirEntry[str] | Path) -> bool:
    """Whether a directory entry is a link to a folder (a dangling link or a loop is not)."""
    try:
        return entry.is_symlink() and entry.is_dir()
    except OSError:
        return False


@functools.lru_cache(maxsize=4096)
def _inside(folder: str, real_root: str) -> bool:
    """Whether a folder resolves to a place inside ``real_root`` (cached per folder: one resolve per
    folder of a batch, not per file)."""
    return Path(folder).resolve().is_relative_to(real_root)


def _shown(path: Path) -> str:
    """A path for a message: its escaped key form when it is not valid UTF-8."""
    return key_of_name(str(path))
