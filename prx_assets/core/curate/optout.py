"""Opt-out requests: images that must leave every curated subset and shard set.

``prx-assets optout --ids FILE | --uris FILE [--reason TEXT]`` records one immutable request
under ``<data root>/optout/<request id>.json`` (the id hashes its content, so recording the
same file twice is one request). Every recipe applies every request on its next cut; the
shard sets that held those images are republished as deltas whose skip lists hide them (no
shard is rewritten), and both manifests name the requests that removed what.

Files hold one value per line; blank lines and ``#`` comments are ignored. Image ids are the
16-hex-digit ids of the lab; URIs are the source URIs of the files.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from prx_assets.core import layout
from prx_assets.core.config.storage import DataRoot
from prx_assets.errors import ConfigError

_IMAGE_ID = re.compile(r"^[0-9a-f]{16}$")


@dataclass(frozen=True)
class OptOutRequest:
    """One request: image ids and/or source URIs, with a reason (lineage)."""

    request_id: str
    reason: str
    image_ids: tuple[str, ...] = ()
    uris: tuple[str, ...] = ()

    def to_json(self) -> bytes:
        """The stored request."""
        return json.dumps({"request_id": self.request_id, "reason": self.reason,
                           "image_ids": list(self.image_ids), "uris": list(self.uris)}, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str = "") -> OptOutRequest:
        """Read a stored request."""
        try:
            doc = json.loads(data)
            return cls(request_id=doc["request_id"], reason=doc.get("reason", ""),
                       image_ids=tuple(doc.get("image_ids", ())), uris=tuple(doc.get("uris", ())))
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"opt-out request {where} is unreadable ({e})", path=where,
                              fix="remove the file and record the request again with `prx-assets optout`") from e


def read_lines(path: str | Path, kind: str) -> tuple[str, ...]:
    """The values of an opt-out file; a bad line is a ConfigError naming its number.

    ``kind`` is ``ids`` (16 hex digits each) or ``uris`` (no spaces).
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError("file not found", path=str(p), fix=f"pass a file with one {kind[:-1]} per line")
    out: list[str] = []
    for n, raw in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        value = raw.split("#", 1)[0].strip()
        if not value:
            continue
        if kind == "ids" and not _IMAGE_ID.match(value):
            raise ConfigError(f"line {n}: {value!r} is not an image id (16 lowercase hex digits)", path=str(p),
                              fix="list lab image ids (see `prx-assets query --columns image_id,uri`), or pass "
                                  "source URIs with --uris")
        if kind == "uris" and any(c.isspace() for c in value):
            raise ConfigError(f"line {n}: {value!r} contains whitespace; one URI per line", path=str(p),
                              fix="put each URI on its own line")
        out.append(value)
    if not out:
        raise ConfigError("no values in the file", path=str(p), fix=f"list one {kind[:-1]} per line")
    return tuple(dict.fromkeys(out))


def new_request(image_ids: tuple[str, ...] = (), uris: tuple[str, ...] = (), reason: str = "") -> OptOutRequest:
    """A request whose id hashes its content (the same file and reason make the same request)."""
    ids, links = tuple(sorted(set(image_ids))), tuple(sorted(set(uris)))
    digest = hashlib.sha256(json.dumps([ids, links, reason]).encode()).hexdigest()[:12]
    return OptOutRequest(request_id=f"optout-{digest}", reason=reason, image_ids=ids, uris=links)


def record(root: DataRoot, request: OptOutRequest) -> bool:
    """Store a request; ``False`` when the same request was already recorded."""
    return root.write_new(layout.optout_request(request.request_id), request.to_json())


def load_requests(root: DataRoot) -> list[OptOutRequest]:
    """Every recorded request, in id order (one listing of the opt-out folder)."""
    out = []
    for rel in sorted(root.list(layout.OPTOUT_DIR)):
        if rel.endswith(".json"):
            out.append(OptOutRequest.from_json(root.read_bytes(rel), root.join(rel)))
    return out


def registry_version(requests: list[OptOutRequest]) -> str:
    """Identity of the set of requests (what curation applied)."""
    return hashlib.sha256(json.dumps(sorted(r.request_id for r in requests)).encode()).hexdigest()[:12]


def erased_ids(root: DataRoot) -> frozenset[str]:
    """Every image id an erasure removed (``erased/<request id>.json``): ingest records them as
    ``erased`` rejects instead of storing them again. One listing and a small file per erasure."""
    out: set[str] = set()
    for rel in root.list(layout.ERASED_DIR):
        if rel.endswith(".json"):
            out.update(json.loads(root.read_bytes(rel)).get("image_ids", ()))
    return frozenset(out)
