"""The files one stage writes and another reads: frozen, typed, with ``to_json``/``from_json``.

- :class:`SubsetManifest` — ``curated/<recipe>/<subset id>/subset.json``
- :class:`ShardSetManifest` — ``mds/<recipe>/<shard set id>/manifest.json``
- :class:`MixtureSpec` (of :class:`MixtureStream`) — ``mixtures/<mixture>/<version>.json``

(the ingest batch manifest, :class:`prx_assets.core.ingest.batches.BatchManifest`, has the
same shape). The JSON layout is the one readers outside this package see; keys a reader
does not know are kept in ``extra`` and written back, so older and newer files round-trip.
Paths come from :mod:`prx_assets.core.layout`.

>>> m = MixtureStream(recipe="r", shard_set_id="s", uri="/d", samples=3, proportion=1.0)
>>> MixtureStream.from_json(m.to_json()) == m
True
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from prx_assets.core import layout
from prx_assets.core.config.storage import DataRoot, ObjectStoreSettings, read_uri
from prx_assets.errors import PrxError, WithdrawnError

T = TypeVar("T", bound="JsonRecord")


class ManifestError(PrxError):
    """A manifest file that cannot be read: not JSON, or a required key is missing."""


class JsonRecord:
    """``to_dict``/``to_json``/``from_dict``/``from_json`` for a frozen dataclass with an ``extra`` field."""

    #: Fields stored as tuples in Python and lists in JSON.
    _tuples: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (``extra`` keys at the top level, beside the known ones)."""
        out: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            if isinstance(value, JsonRecord):
                value = value.to_dict()
            elif isinstance(value, tuple):
                value = [v.to_dict() if isinstance(v, JsonRecord) else v for v in value]
            out[f.name] = value
        return {**getattr(self, "extra", {}), **out}

    def to_json(self) -> bytes:
        """Sorted, indented UTF-8 JSON."""
        return json.dumps(self.to_dict(), indent=1, sort_keys=True, default=str).encode()

    @classmethod
    def from_dict(cls: type[T], doc: Mapping[str, Any], where: str = "") -> T:
        """Build from a parsed document; unknown keys go to ``extra``; a missing key names the file."""
        known = {f.name: f for f in fields(cls) if f.name != "extra"}  # type: ignore[arg-type]
        kwargs: dict[str, Any] = {}
        for name, f in known.items():
            if name in doc:
                value = doc[name]
                kwargs[name] = tuple(value) if name in cls._tuples and value is not None else value
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ManifestError(f"{cls.__name__} {where or ''} has no {name!r}; it was not written by this "
                                    "version of prx_assets (re-materialize it)".replace("  ", " "))
        if "extra" in {f.name for f in fields(cls)}:  # type: ignore[arg-type]
            kwargs["extra"] = {k: v for k, v in doc.items() if k not in known}
        return cls(**kwargs)

    @classmethod
    def from_json(cls: type[T], data: bytes | str, where: str = "") -> T:
        """Parse JSON text or bytes (``where`` names the file in errors)."""
        try:
            doc = json.loads(data)
        except ValueError as e:
            raise ManifestError(f"{cls.__name__} {where} is not valid JSON: {e}") from e
        if not isinstance(doc, dict):
            raise ManifestError(f"{cls.__name__} {where} is not a JSON object")
        return cls.from_dict(doc, where)


@dataclass(frozen=True)
class SubsetManifest(JsonRecord):
    """A curated subset: what a recipe selected from one Lance version (ids in ``ids``)."""

    subset_id: str
    recipe: str
    recipe_hash: str
    lance_uri: str
    lance_version: int
    ids: str
    selected: int
    total: int = 0
    lance_tag: str | None = None
    dropped: dict[str, int] = field(default_factory=dict)
    buckets: dict[str, int] = field(default_factory=dict)
    caption_columns: tuple[str, ...] = ()
    optout_requests: dict[str, int] = field(default_factory=dict)  # request id -> images it removed here
    version: int | None = None  # the Lance version again (older readers use this key)
    extra: dict[str, Any] = field(default_factory=dict)

    _tuples: ClassVar[tuple[str, ...]] = ("caption_columns",)


@dataclass(frozen=True)
class ShardSetManifest(JsonRecord):
    """A published MDS shard set and its lineage (written last: its presence means the set is complete)."""

    shard_set_id: str
    recipe: str
    subset_id: str
    lance_uri: str
    lance_version: int
    uri: str
    samples: int
    shards: int
    bytes: int
    recipe_hash: str = ""
    lance_tag: str | None = None
    captioner_ids: tuple[str, ...] = ()
    caption_plan: dict[str, Any] = field(default_factory=dict)
    columns: dict[str, str] = field(default_factory=dict)
    code_version: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    text_latents: dict[str, Any] | None = None
    bucket_streams: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    #: Physical MDS streams, in order: {"uri", "samples", "role": "base" | "delta", "written_by"}, and
    #: "sidecars": [{"uri", "columns", "written_by"}] when columns were added to it later.
    streams: tuple[dict[str, Any], ...] = ()
    skip_uri: str | None = None  # skip.parquet: (stream, index, image_id) never yielded
    skip_sha256: str | None = None  # of skip.parquet's bytes: a reader can check what it applies
    skipped: int = 0
    layout: str = "full"  # "full": written whole; "delta": previous streams + one delta + skip list
    bytes_written: int = 0  # bytes this publication wrote (a delta writes only its new samples)
    #: Caption columns the per-sample digests in ``samples.parquet`` cover (``None``: written before
    #: this was recorded). Sidecars need it to tell stale published samples apart.
    digest_columns: tuple[str, ...] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # lineage such as dagster_run_id

    _tuples: ClassVar[tuple[str, ...]] = ("captioner_ids", "streams", "digest_columns")

    def skip_arrays(self) -> tuple[Any, Any]:
        """``(streams, indices)``: numpy int64 arrays of every sample the skip list hides (stream, sample
        index), checked against ``skip_sha256`` (a ValueError when the file was modified after publication)."""
        import numpy as np

        if not self.skip_uri:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        data = read_uri(self.skip_uri)
        if self.skip_sha256 and hashlib.sha256(data).hexdigest() != self.skip_sha256:
            raise ValueError(f"skip list {self.skip_uri} does not match the sha256 in shard set "
                             f"{self.shard_set_id}'s manifest; the set was modified after publication: republish it")
        import pyarrow.parquet as pq  # only shard sets with a skip list need it (the trainer runs without it)

        t = pq.read_table(io.BytesIO(data), columns=["stream", "index"])
        return (t.column("stream").to_numpy().astype(np.int64, copy=False),
                t.column("index").to_numpy().astype(np.int64, copy=False))

    def skip_pairs(self) -> list[tuple[int, int]]:
        """``(stream, sample index)`` of every sample the skip list hides (see :meth:`skip_arrays`)."""
        streams, indices = self.skip_arrays()
        return list(zip(streams.tolist(), indices.tolist(), strict=True))

    def physical_streams(self) -> list[dict[str, Any]]:
        """The MDS streams to read (one, at ``uri``, for sets written before streams were listed)."""
        return list(self.streams) or [{"uri": self.uri, "samples": self.samples, "role": "base"}]

    @property
    def validate_hash(self) -> str | None:
        """The first per-shard hash recorded (what a reader can verify), if any."""
        return (list(self.settings.get("hashes") or []) or [None])[0]


@dataclass(frozen=True)
class MixtureStream(JsonRecord):
    """One stream of a mixture: a recipe's shard set and how it is weighted."""

    recipe: str
    shard_set_id: str
    uri: str
    samples: int
    proportion: float | None = None
    repeat: float | None = None
    choose: int | None = None
    caption_plan: dict[str, Any] | None = None
    lance_version: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    #: Where the set lives and which Lance version it came from: lineage, not identity.
    LINEAGE: ClassVar[tuple[str, ...]] = ("uri", "lance_version")

    def identity(self) -> dict[str, Any]:
        """What the trainer reads from this stream: the shard set's content id, size and weighting."""
        return {k: v for k, v in self.to_dict().items() if k not in self.LINEAGE}

    def weighting(self) -> str:
        """``proportion 0.7``, ``repeat 2``, ``choose 100`` or ``all samples``."""
        for key in ("proportion", "repeat", "choose"):
            if getattr(self, key) is not None:
                return f"{key} {getattr(self, key)}"
        return "all samples"


@dataclass(frozen=True)
class MixturePhase(JsonRecord):
    """One phase of a phased mixture: its streams and weights, image resolution and step count."""

    name: str
    steps: int
    epoch_size: int
    streams: tuple[MixtureStream, ...]
    expected_samples_per_stream: dict[str, int]
    resolution: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], where: str = "") -> MixturePhase:
        """Build from a parsed document (streams become :class:`MixtureStream`)."""
        streams = tuple(MixtureStream.from_dict(s, f"{where} stream {i}") for i, s in enumerate(doc.get("streams", [])))
        base = super().from_dict({**doc, "streams": []}, where)
        return dataclasses.replace(base, streams=streams)

    def identity(self) -> dict[str, Any]:
        """What the trainer reads in this phase (streams by content id, not location)."""
        return {**self.to_dict(), "streams": [s.identity() for s in self.streams]}


@dataclass(frozen=True)
class MixtureSpec(JsonRecord):
    """What the trainer streams: shard sets with weights, the epoch size and the expected samples per stream.

    ``mixture_version`` hashes what the trainer reads (shard set content ids, weights, epoch,
    caption plans), not where the sets live: the same inputs on another data root give the
    same version, and one version means one training run.
    """

    name: str
    epoch_size: int
    streams: tuple[MixtureStream, ...]
    expected_samples_per_stream: dict[str, int]
    mixture_version: str = ""
    #: A phased mixture's phases, in training order (``streams`` then lists every stream of any
    #: phase, for lineage); empty for a mixture of one phase.
    phases: tuple[MixturePhase, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], where: str = "") -> MixtureSpec:
        """Build from a parsed document (streams and phases become records)."""
        streams = tuple(MixtureStream.from_dict(s, f"{where} stream {i}") for i, s in enumerate(doc.get("streams", [])))
        phases = tuple(MixturePhase.from_dict(p, f"{where} phase {i}") for i, p in enumerate(doc.get("phases") or []))
        base = super().from_dict({**doc, "streams": [], "phases": []}, where)
        return dataclasses.replace(base, streams=streams, phases=phases)

    def content_version(self) -> str:
        """The hash of the spec's content (streams' identities, not their locations; the phases'
        streams, weights, resolutions and steps): what ``mixture_version`` must equal."""
        doc = {**self.extra, "name": self.name, "epoch_size": self.epoch_size,
               "expected_samples_per_stream": self.expected_samples_per_stream,
               "streams": [s.identity() for s in self.streams]}
        if self.phases:
            doc["phases"] = [p.identity() for p in self.phases]
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]

    def phase(self, name: str | None) -> MixturePhase | None:
        """The phase called ``name`` (``None``: none asked for); a phased spec read without naming a
        phase, or a name it does not have, is refused with the names it has."""
        names = [p.name for p in self.phases]
        if name is None and not self.phases:
            return None
        match = next((p for p in self.phases if p.name == name), None)
        if match is None:
            raise ValueError(f"mixture {self.name} v{self.mixture_version} has phases {names}; "
                             f"{'pass phase=<name>' if name is None else f'it has no phase {name!r}'}: one of {names}")
        return match

    def versioned(self) -> MixtureSpec:
        """This spec with ``mixture_version`` set from its content."""
        return dataclasses.replace(self, mixture_version=self.content_version())


def read_shard_set_at(folder_or_manifest: str, settings: ObjectStoreSettings | None = None) -> ShardSetManifest:
    """A shard set's manifest by its folder or ``manifest.json`` path/URI (local or object store)."""
    uri = layout.manifest_of(folder_or_manifest)
    return ShardSetManifest.from_json(read_uri(uri, settings), uri)


def refuse_withdrawn(folder_or_manifest: str, settings: ObjectStoreSettings | None = None) -> None:
    """Raise :class:`~prx_assets.errors.WithdrawnError` when the shard set at ``folder_or_manifest``
    was withdrawn by an erasure (a ``withdrawn.json`` beside its manifest)."""
    base = layout.manifest_of(folder_or_manifest).rpartition("/")[0]
    root = DataRoot(base or "/", settings or ObjectStoreSettings.from_env())
    if not root.exists(layout.WITHDRAWN_FILE):
        return
    doc = json.loads(root.read_bytes(layout.WITHDRAWN_FILE))
    raise WithdrawnError(f"shard set {base} was withdrawn by erasure {doc.get('request_id')}: it would yield "
                         f"{doc.get('samples')} erased samples; use a set version published after the erasure "
                         "(`prx-assets run` publishes one) or the mixture spec written with it")


def read_mixture_spec_at(uri: str, settings: ObjectStoreSettings | None = None) -> MixtureSpec:
    """A mixture spec by absolute path or URI (local or object store)."""
    return MixtureSpec.from_json(read_uri(uri, settings), uri)
