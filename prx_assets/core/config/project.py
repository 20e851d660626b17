"""Project configuration: data root, config folder and ``sources.yaml``.

``sources.yaml`` minimal form::

    sources:
      - {name: photos, kind: folder, path: /data/photos}
      - {name: pub, kind: s3, uri: s3://bucket/prefix}

Optional top-level ``ingest:`` settings apply to every source; a source may override
them under its own ``ingest:`` key. Values may reference environment variables as
``${VAR}`` or ``${VAR:-default}``; ``${PRX_DATA_ROOT}`` always resolves (default
``./data``). Relative local paths are resolved against the config file's folder.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, Field

from prx_assets.core.config.schema import STRICT, mapping, model_of, validate
from prx_assets.errors import ConfigError

T = TypeVar("T")

DEFAULT_DATA_ROOT = "./data"
DEFAULT_CONFIG_DIR = "./config"
SOURCE_KINDS = ("folder", "s3", "gcs", "parquet", "webdataset")
SOURCE_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,47}$")
DEFAULT_EXTENSIONS = ("jpg", "jpeg", "jfif", "png", "webp", "gif", "bmp", "tif", "tiff")
DEFAULT_ASPECT_BUCKETS = (
    "9:21", "9:16", "2:3", "3:4", "4:5", "1:1", "5:4", "4:3", "3:2", "16:9", "21:9",
)
DEFAULT_BATCH_SIZE = {"folder": 2000, "s3": 2000, "gcs": 2000, "parquet": 5000, "webdataset": 4}
_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def data_root() -> str:
    """Return the data root: ``$PRX_DATA_ROOT`` or ``./data``, local paths made absolute."""
    root = os.environ.get("PRX_DATA_ROOT") or DEFAULT_DATA_ROOT
    if "://" in root:
        return root.rstrip("/")
    return str(Path(root).expanduser().resolve())


def default_config_files() -> dict[str, bytes]:
    """The demo project's config files shipped inside the package (name -> bytes)."""
    import importlib.resources

    folder = importlib.resources.files("prx_assets") / "defaults" / "config"
    return {f.name: f.read_bytes() for f in folder.iterdir() if f.name.endswith(".yaml")}


def ensure_config_dir() -> tuple[Path, bool]:
    """The config folder, created from the packaged demo config if it does not exist; (folder, created)."""
    folder = config_dir()
    if folder.exists():
        return folder, False
    folder.mkdir(parents=True)
    for name, data in default_config_files().items():
        (folder / name).write_bytes(data)
    return folder, True


def config_dir() -> Path:
    """Return the config folder: ``$PRX_CONFIG_DIR`` or ``./config``, made absolute."""
    return Path(os.environ.get("PRX_CONFIG_DIR") or DEFAULT_CONFIG_DIR).expanduser().resolve()


#: Values of ``lossless_fallback``: the lossless formats, or ``off``.
LOSSLESS_FORMATS = ("webp", "png", "off")


#: Partitions with at least this many items ingest in worker processes by default (``processes: 0``).
PROCESS_MIN_ITEMS = 64


@dataclass(frozen=True)
class IngestSettings:
    """How every image is validated and normalized.

    Parameters
    ----------
    jpeg_quality:
        JPEG quality of the stored bytes (the published threshold is 92).
    jpeg_subsampling:
        Chroma subsampling of the stored JPEG: ``4:2:0``, ``4:2:2`` or ``4:4:4``.
    max_side:
        Downscale so the longer side is at most this many pixels (``None``: keep).
    min_side:
        Reject images whose shorter side is below this many pixels.
    max_aspect:
        Reject images whose long/short side ratio exceeds this.
    max_pixels:
        Reject images whose header declares more pixels than this (decompression bombs);
        judged before any pixel is decoded.
    aspect_buckets:
        Aspect-ratio buckets as ``"W:H"`` strings; each image gets the nearest in log ratio.
    q92_cycles, q92_sample, q92_min_psnr_db:
        The JPEG quality check: decode/encode cycles, the fewest images sampled per partition,
        and the bound the sample's mean PSNR (against the original pixels) must stay above
        after every cycle.
    q92_confirm_db:
        When some sampled image was measured on tiles and the sample's mean PSNR comes within this
        many dB of ``q92_min_psnr_db`` (or below it) after any cycle, the check measures those
        images again whole, re-read from the source, and judges on that: the tiles' estimate of a
        partition's mean curve erred by up to 0.5 dB on photographs whose loss gathers in a few
        places (``python -m bench peer``'s corpus, 40 draws of the sample), so a verdict near the
        bound is not left to it. ``0``: never.
    q92_sample_share, q92_tile_pixels, q92_png_reference:
        The check's sample scales with the partition: this share of its images (at least
        ``q92_sample``, at most 512), each measured at ingest on MCU-aligned 128-pixel cells cycled
        with 16 pixels of margin, 90% of the cycles of ``q92_tile_pixels`` of such tiles through every
        cycle (8 tiles for the default), drawn where its stored JPEG loses most and then where a
        second cycle shows it keeps losing (0: the whole image); ``q92_png_reference`` also
        measures the lossless PNG size of the first draws' cells for the JPEG/PNG size ratio.
    workers:
        Threads that read, decode and encode in parallel within one partition (Pillow releases
        the GIL in its codecs); ``0`` means one per CPU.
    processes:
        Worker processes that decode and encode within one partition (about 40% of the work
        holds the GIL, so threads alone reach about 1.4x on two cores); ``0`` (default) means one
        per CPU for partitions of at least ``PROCESS_MIN_ITEMS`` items and none for smaller ones
        (a pool costs a fraction of a second to start), ``1`` means threads only.
    readahead:
        Images of the next batch a process decodes ahead, while it finishes a batch (its commit, its
        check, Dagster's bookkeeping) or starts up, when it knows which batch comes next
        (``prx-assets run``); their outcomes wait in memory (the stored bytes of this many images,
        at most 256 MB) for that batch's run. ``0``: never. Only with worker processes
        (``processes`` above 1).
    lossless_fallback:
        Content-aware storage: ``webp`` (default: lossless WebP) or ``png`` stores losslessly, in that format,
        each image whose first-generation JPEG loses more than ``q92_min_psnr_db`` (dense line
        art, text, saturated palettes) and each synthetic image of at most
        ``lossless_max_colors`` colors whose lossless bytes are at most twice the JPEG's;
        ``off`` stores every image as JPEG (and leaves stored bytes and fingerprints exactly as
        before this setting existed).
    lossless_max_colors:
        Images with at most this many distinct colors count as synthetic (0 turns that rule off).
    fallback_warn_share:
        The q92 check warns (without blocking) when more than this share of a partition is
        stored losslessly.
    """

    jpeg_quality: int = 92
    jpeg_subsampling: str = "4:2:0"
    max_side: int | None = None
    min_side: int = 64
    max_aspect: float = 4.0
    max_pixels: int = 100_000_000
    aspect_buckets: tuple[str, ...] = DEFAULT_ASPECT_BUCKETS
    q92_cycles: int = 10
    q92_sample: int = 6
    q92_min_psnr_db: float = 37.0
    q92_confirm_db: float = 2.0
    q92_sample_share: float = 0.01
    q92_tile_pixels: int = 12 * 128 * 128
    q92_png_reference: bool = False
    workers: int = 0
    processes: int = 0
    readahead: int = 256
    lossless_fallback: str = "webp"
    lossless_max_colors: int = 64
    fallback_warn_share: float = 0.25

    def normalization_fingerprint(self) -> str:
        """Hash of the settings that change stored bytes (not check/worker settings). With
        ``lossless_fallback: off`` it is the fingerprint of before content-aware storage."""
        keys = ["jpeg_quality", "jpeg_subsampling", "max_side", "min_side", "max_aspect",
                "max_pixels", "aspect_buckets"]
        if self.lossless_fallback != "off":  # the bound then decides which images are stored how
            keys += ["lossless_fallback", "lossless_max_colors", "q92_min_psnr_db"]
        payload = json.dumps({k: getattr(self, k) for k in keys}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def q92_check_settings(self) -> dict[str, Any]:
        """The settings a q92 cycle curve depends on (a curve measured under others is not reused)."""
        return {"quality": self.jpeg_quality, "subsampling": self.jpeg_subsampling, "cycles": self.q92_cycles,
                "tile_pixels": self.q92_tile_pixels, "png_reference": self.q92_png_reference,
                "max_side": self.max_side, "tiles": "two-phase-by-first-and-second-cycle-error"}

    def effective_processes(self, items: int) -> int:
        """Worker processes for a partition of ``items`` items (1: none, threads only)."""
        if self.processes > 0:
            return self.processes
        cpus = os.cpu_count() or 1
        return cpus if cpus > 1 and items >= PROCESS_MIN_ITEMS else 1

    def effective_workers(self) -> int:
        """Number of worker threads to use."""
        return self.workers if self.workers > 0 else max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class SourceConfig:
    """One named image collection from ``sources.yaml``."""

    name: str
    kind: str
    location: str
    batch_size: int
    extensions: tuple[str, ...] | None = DEFAULT_EXTENSIONS
    recursive: bool = True
    image_column: str = "image"
    caption_field: str | None = None
    license_field: str | None = None
    license: str | None = None
    carry: tuple[str, ...] = ()
    ingest: IngestSettings = field(default_factory=IngestSettings)
    follow_links: bool = False  # folder sources: ingest what links leading out of the folder point to

    def fingerprint(self) -> str:
        """Hash of everything in this source's config that changes ingested rows. Not its location:
        rows are keyed by the path relative to it, so a source re-pointed at a new mount or prefix
        holding the same files ingests nothing again."""
        payload = dataclasses.asdict(self)
        payload.pop("batch_size")
        payload.pop("location")
        if not payload["follow_links"]:
            payload.pop("follow_links")  # the default leaves earlier fingerprints as they were
        payload["ingest"] = self.ingest.normalization_fingerprint()
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class SourcesConfig:
    """The parsed ``sources.yaml``."""

    path: str
    sources: tuple[SourceConfig, ...]
    ingest: IngestSettings

    def get(self, name: str) -> SourceConfig:
        """Return the source called ``name`` or raise a ConfigError listing the known ones."""
        return named(self.sources, name, "source", self.path, "add it to sources.yaml or use one of the known names")


#: ``IngestSettings`` as a strict model (its schema; validation goes through :func:`validate`).
IngestSettingsModel = model_of(IngestSettings)


class _SourceEntry(BaseModel):
    """The keys every source of ``sources.yaml`` may set."""

    model_config = STRICT
    name: str = Field(pattern=SOURCE_NAME_RE.pattern, description="Unique source name (partition keys start with it).")
    description: str | None = None
    batch_size: int | None = Field(default=None, ge=1, description="Items per ingest batch (partition); default "
                                   "2000 for folders and object stores, 5000 rows of Parquet, 4 tar shards.")
    extensions: list[str] | None = Field(default=list(DEFAULT_EXTENSIONS), description="File extensions ingested "
                                         "(folders, object stores); null: every file.")
    recursive: bool = True
    image_column: str = Field(default="image", description="Parquet: the column holding image bytes.")
    caption_field: str | None = Field(default=None, description="Where a source caption is: a Parquet column or a "
                                      "WebDataset member extension.")
    license_field: str | None = None
    license: str | None = Field(default=None, description="A license for every image of the source.")
    carry: list[str] = Field(default_factory=list, description="Fields carried into the lab as they are.")
    ingest: IngestSettingsModel | None = Field(default=None, description="Ingest settings over the file's "
                                               "top-level ones.")
    follow_links: bool = Field(default=False, description="Folders: ingest what links leading out of the folder "
                               "point to.")


class FolderSourceEntry(_SourceEntry):
    """A folder of image files (local, shared filesystem, or an object-store prefix given as ``uri``)."""

    kind: Literal["folder"]
    path: str | None = None
    uri: str | None = None


class ObjectStoreSourceEntry(_SourceEntry):
    """Image files under an ``s3://`` or ``gs://`` prefix."""

    kind: Literal["s3", "gcs"]
    uri: str


class FileSourceEntry(_SourceEntry):
    """Parquet files with image bytes, or WebDataset tar shards."""

    kind: Literal["parquet", "webdataset"]
    path: str | None = None
    uri: str | None = None


#: One ``sources:`` entry: its keys depend on its ``kind``.
SourceEntry = Annotated[FolderSourceEntry | ObjectStoreSourceEntry | FileSourceEntry, Field(discriminator="kind")]
_ENTRY_OF_KIND: dict[str, type[_SourceEntry]] = {"folder": FolderSourceEntry, "s3": ObjectStoreSourceEntry,
                                                 "gcs": ObjectStoreSourceEntry, "parquet": FileSourceEntry,
                                                 "webdataset": FileSourceEntry}


class SourcesFile(BaseModel):
    """``sources.yaml``: the image collections, and ingest settings for all of them."""

    model_config = STRICT
    sources: list[SourceEntry]
    ingest: IngestSettingsModel | None = None


def expand_env(value: str) -> str:
    """Expand ``${VAR}`` / ``${VAR:-default}``; ``PRX_DATA_ROOT`` defaults to the data root."""

    def repl(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if name == "PRX_DATA_ROOT":
            return data_root()
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise KeyError(name)

    return _ENV_RE.sub(repl, value)


def _parse_ingest(raw: Any, base: IngestSettings, where: str, path: str) -> IngestSettings:
    """``raw`` ingest settings over ``base`` (the file's top-level ones), validated and checked."""
    if raw is None:
        return base
    if not isinstance(raw, Mapping):
        raise ConfigError(f"'ingest' must be a mapping, got {type(raw).__name__}", path=path,
                          entry=where, fix="write ingest settings as key: value pairs")
    values = dict(raw)
    if values.get("lossless_fallback") is False:
        values["lossless_fallback"] = "off"  # YAML reads a bare `off` as false
    if isinstance(values.get("aspect_buckets"), str):
        raise ConfigError(f"aspect_buckets={values['aspect_buckets']!r}: expected a list of 'W:H' strings, got str",
                          path=path, entry=where, fix="write aspect_buckets: ['1:1', '4:3', '16:9']")
    merged = {**dataclasses.asdict(base), **values}
    settings = validate(IngestSettings, merged, path, where, what="ingest setting")
    for bucket in settings.aspect_buckets:
        _parse_ratio(bucket, path, where)
    _validate_ingest(settings, path, where)
    return settings


def _parse_ratio(bucket: str, path: str, where: str) -> float:
    try:
        w, h = (float(x) for x in bucket.split(":"))
        if w <= 0 or h <= 0:
            raise ValueError
    except ValueError:
        raise ConfigError(f"aspect bucket {bucket!r} is not of the form 'W:H'", path=path,
                          entry=where, fix="write buckets like '16:9'") from None
    return w / h


def _validate_ingest(s: IngestSettings, path: str, where: str) -> None:
    def bad(msg: str, fix: str) -> ConfigError:
        return ConfigError(msg, path=path, entry=where, fix=fix)

    if not (1 <= int(s.jpeg_quality) <= 100):
        raise bad(f"jpeg_quality={s.jpeg_quality!r} is outside 1..100", "use e.g. 92")
    if s.jpeg_subsampling not in ("4:2:0", "4:2:2", "4:4:4"):
        raise bad(f"jpeg_subsampling={s.jpeg_subsampling!r} is not supported",
                  "use 4:2:0, 4:2:2 or 4:4:4")
    if s.max_side is not None and int(s.max_side) < max(1, s.min_side):
        raise bad(f"max_side={s.max_side!r} is below min_side={s.min_side}", "raise max_side")
    if s.min_side < 1 or s.max_aspect < 1 or s.max_pixels < 1:
        raise bad("min_side, max_pixels must be >= 1 and max_aspect >= 1",
                  "fix the ingest limits")
    if s.workers < 0 or s.processes < 0:
        raise bad(f"workers={s.workers!r} and processes={s.processes!r} must be >= 0", "use 0 (one per CPU)")
    if s.readahead < 0:
        raise bad(f"readahead={s.readahead!r} must be >= 0", "use e.g. 256 images (0: never read ahead)")
    if s.q92_cycles < 1 or s.q92_sample < 1:
        raise bad("q92_cycles and q92_sample must be >= 1", "use e.g. 10 cycles, 6 images")
    if not (0.0 < s.q92_sample_share <= 1.0) or s.q92_tile_pixels < 0:
        raise bad(f"q92_sample_share={s.q92_sample_share!r} must be within (0, 1] and q92_tile_pixels="
                  f"{s.q92_tile_pixels!r} >= 0", "use e.g. 0.01 and 196608 (0 measures whole images)")
    if not s.q92_confirm_db >= 0.0:
        raise bad(f"q92_confirm_db={s.q92_confirm_db!r} must be >= 0", "use e.g. 2.0 (0: never measure whole)")
    if s.lossless_fallback not in LOSSLESS_FORMATS:
        raise bad(f"lossless_fallback={s.lossless_fallback!r} is not supported",
                  f"use one of: {', '.join(LOSSLESS_FORMATS)}")
    if s.lossless_max_colors < 0 or not (0.0 <= s.fallback_warn_share <= 1.0):
        raise bad(f"lossless_max_colors={s.lossless_max_colors!r} must be >= 0 and fallback_warn_share="
                  f"{s.fallback_warn_share!r} within 0..1", "use e.g. 256 and 0.25")


def _resolve_location(raw: str, kind: str, config_path: Path, where: str) -> str:
    try:
        value = expand_env(str(raw))
    except KeyError as e:
        raise ConfigError(f"environment variable {e.args[0]} is not set", path=str(config_path),
                          entry=where, fix=f"export {e.args[0]} or write ${{{e.args[0]}:-default}}"
                          ) from None
    scheme = {"s3": "s3://", "gcs": "gs://"}.get(kind)
    if scheme is not None:
        if not value.startswith(scheme):
            raise ConfigError(f"uri {value!r} is not an {scheme} URI", path=str(config_path),
                              entry=where, fix=f"write uri: {scheme}bucket/prefix")
        return value.rstrip("/") + "/"
    if "://" in value:
        if not value.startswith(("s3://", "gs://")):
            raise ConfigError(f"unsupported URI scheme in {value!r}", path=str(config_path), entry=where,
                              fix="use a filesystem path, an s3:// or a gs:// URI")
        return value.rstrip("/") + "/" if kind == "folder" else value
    p = Path(value).expanduser()
    if not p.is_absolute():
        p = (config_path.parent / p).resolve()
    return str(p)


def read_yaml(path: Path, missing_fix: str) -> Any:
    """Load a config file, raising ConfigError naming the file (and line) when it is absent or malformed."""
    spath = str(path)
    if not path.is_file():
        raise ConfigError("file not found", path=spath, fix=missing_fix)
    try:
        return yaml.safe_load(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"not UTF-8 text: byte {e.object[e.start:e.start + 1]!r} at offset {e.start}", path=spath,
                          fix="save the file as UTF-8") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"malformed YAML{where}: {problem}", path=spath,
                          fix="fix the YAML syntax") from None


def read_entries(path: Path, key: str, example: str) -> list[Any]:
    """The top-level ``key:`` list of a config file (``recipes:``, ``mixtures:``), or a ConfigError with ``example``."""
    doc = read_yaml(path, "create it or point PRX_CONFIG_DIR at its folder") or {}
    if not isinstance(doc, Mapping) or not isinstance(doc.get(key), list):
        raise ConfigError(f"expected a mapping with a '{key}:' list", path=str(path), fix=f"write {example}")
    return doc[key]


def named(items: Sequence[T], name: str, what: str, path: str, fix: str) -> T:
    """The item whose ``name`` is ``name``; else a ConfigError listing the known names."""
    for item in items:
        if getattr(item, "name", None) == name:
            return item
    known = ", ".join(getattr(i, "name", "?") for i in items) or "(none)"
    raise ConfigError(f"no {what} named {name!r}; known {what}s: {known}", path=path, fix=fix)


def load_sources(path: str | os.PathLike[str] | None = None) -> SourcesConfig:
    """Parse and validate ``sources.yaml``.

    Parameters
    ----------
    path:
        The file; defaults to ``$PRX_CONFIG_DIR/sources.yaml``.

    Raises
    ------
    ConfigError
        Naming the file, the source and the fix, for malformed YAML, unknown kinds or
        keys, duplicate names, or invalid settings. Existence of folders is checked when
        the source is listed (see :mod:`prx_assets.core.ingest.sources`).
    """
    cfg_path = Path(path) if path is not None else config_dir() / "sources.yaml"
    spath = str(cfg_path)
    doc = read_yaml(cfg_path, "create it or point PRX_CONFIG_DIR at the folder holding sources.yaml")
    if not isinstance(doc, Mapping) or not isinstance(doc.get("sources"), list):
        raise ConfigError("expected a mapping with a 'sources:' list", path=spath,
                          fix="write sources: [{name: photos, kind: folder, path: /data/photos}]")
    unknown_top = set(doc) - {"sources", "ingest"}
    if unknown_top:
        raise ConfigError(f"unknown top-level keys {sorted(unknown_top)}", path=spath,
                          fix="only 'sources' and 'ingest' are allowed")
    base = _parse_ingest(doc.get("ingest"), IngestSettings(), "ingest", spath)
    sources: list[SourceConfig] = []
    for i, raw in enumerate(doc["sources"]):
        source = _parse_source(raw, i, base, cfg_path)
        if any(s.name == source.name for s in sources):
            raise ConfigError("duplicate source name", path=spath, entry=f"source {source.name!r}",
                              fix="give every source a unique name")
        sources.append(source)
    return SourcesConfig(path=spath, sources=tuple(sources), ingest=base)


def _parse_source(raw: Any, i: int, base: IngestSettings, cfg_path: Path) -> SourceConfig:
    """One ``sources:`` entry, validated (its kind's keys and types) and resolved."""
    spath = str(cfg_path)
    raw = mapping(raw, spath, f"sources[{i}]", "{name: ..., kind: ..., path: ...}")
    name = raw.get("name")
    if not isinstance(name, str) or not SOURCE_NAME_RE.match(name):
        raise ConfigError(f"source name {name!r} is invalid", path=spath, entry=f"sources[{i}]",
                          fix="use lowercase letters, digits and '_' starting with a letter")
    where = f"source {name!r}"
    kind = raw.get("kind")
    if kind not in SOURCE_KINDS:
        raise ConfigError(f"unknown source kind {kind!r}", path=spath, entry=where,
                          fix=f"use one of: {', '.join(SOURCE_KINDS)}")
    entry = validate(_ENTRY_OF_KIND[kind], {k: v for k, v in raw.items() if k != "ingest"}, spath, where)
    loc = getattr(entry, "uri", None) if kind in ("s3", "gcs") else (getattr(entry, "path", None) or entry.uri)
    if not loc:
        key = "uri" if kind in ("s3", "gcs") else "path"
        raise ConfigError(f"missing '{key}'", path=spath, entry=where, fix=f"add {key}: ... to the source")
    exts = tuple(e.lower().lstrip(".") for e in entry.extensions) if entry.extensions is not None else None
    if kind == "folder" and loc_scheme(raw, kind):
        kind = "s3" if loc_scheme(raw, kind) == "s3" else "gcs"  # a folder on an object store is a prefix
    return SourceConfig(
        name=name, kind=kind, location=_resolve_location(loc, kind, cfg_path, where),
        batch_size=entry.batch_size or DEFAULT_BATCH_SIZE[kind], extensions=exts, recursive=entry.recursive,
        image_column=entry.image_column, caption_field=entry.caption_field, license_field=entry.license_field,
        license=entry.license, carry=tuple(entry.carry), ingest=_parse_ingest(raw.get("ingest"), base, where, spath),
        follow_links=entry.follow_links)


def loc_scheme(raw: Mapping[str, Any], kind: str) -> str | None:
    """``s3`` or ``gs`` when a source's location expands to an object-store URI, else None."""
    loc = raw.get("uri") if kind in ("s3", "gcs") else raw.get("path", raw.get("uri"))
    try:
        value = expand_env(str(loc))
    except KeyError:
        return None
    return next((s for s in ("s3", "gs") if value.startswith(f"{s}://")), None)


def bucket_ratios(buckets: tuple[str, ...]) -> list[tuple[str, float]]:
    """Return ``(name, width/height)`` for each ``"W:H"`` bucket."""
    out = []
    for b in buckets:
        w, h = (float(x) for x in b.split(":"))
        out.append((b, w / h))
    return out
