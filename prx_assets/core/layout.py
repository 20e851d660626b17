"""Every path under the data root, in one place.

All functions return paths *relative to the data root* (join them with
``DataRoot.join``/``read_bytes``/``write_bytes``), so the same layout serves a local folder
and an object-store prefix::

    <data root>/
      demo/                                   the generated demo corpus (CORPUS.json marks it)
      ingest/batches/<source>/<seq>.json      immutable batch manifests (one per partition)
      lance/<table>.lance                     images, rejects, captions, embeddings_<embedder id>
      curated/<recipe>/<subset id>/           subset.json + ids.parquet
      curated/_codes/<column>/<key>/          embedding dedup's search codes per Lance data file
      mds/<recipe>/<shard set id>/            MDS shards, index.json, manifest.json
      mixtures/<mixture>/<version>.json       mixture specs the trainer reads
      training/<mixture>/<version>/<run>/     checkpoints (local data roots)
      slurm/                                  job scripts, logs and Pipes files (local data roots)
      optout/<request id>.json                opt-out requests (applied by every recipe)
      leases/<name>/<generation>.json         writer leases (one holder per table partition)

>>> shard_set_manifest("demo_all", "3f2a")
'mds/demo_all/3f2a/manifest.json'
>>> subset_manifest("demo_all", "v12-ab")
'curated/demo_all/v12-ab/subset.json'
"""

from __future__ import annotations

DEMO_DIR = "demo"
DEMO_MARKER = f"{DEMO_DIR}/CORPUS.json"
BATCHES_DIR = "ingest/batches"
LANCE_DIR = "lance"
CURATED_DIR = "curated"
MDS_DIR = "mds"
#: Inside a shard set: ``<set>/columns/s<stream>/`` holds the sidecar columns of physical stream ``<stream>``.
SIDECAR_DIR = "columns"
MIXTURE_DIR = "mixtures"
TRAINING_DIR = "training"
SLURM_DIR = "slurm"
OPTOUT_DIR = "optout"
#: ``erased/<request id>.json``: the ids an erasure removed (ingest refuses them) and its report.
ERASED_DIR = "erased"
LEASES_DIR = "leases"

SUBSET_MANIFEST = "subset.json"
SUBSET_IDS = "ids.parquet"
SHARD_SET_MANIFEST = "manifest.json"
MDS_INDEX = "index.json"
#: Beside a shard set's manifest when an erasure withdrew it (the loader refuses the set).
WITHDRAWN_FILE = "withdrawn.json"


def table(name: str) -> str:
    """A Lance table: ``lance/<name>.lance``."""
    return f"{LANCE_DIR}/{name}.lance"


def lab_sync_state() -> str:
    """Where the lab sync records what it last synced: ``lance/_lab_sync.json``."""
    return f"{LANCE_DIR}/_lab_sync.json"


def table_name(rel: str) -> str | None:
    """The table name of a path under ``lance/`` (``None`` when it is not a table folder)."""
    leaf = rel.rstrip("/").rsplit("/", 1)[-1]
    return leaf.removesuffix(".lance") if leaf.endswith(".lance") else None


def batches_dir(source: str) -> str:
    """The folder of a source's batch manifests."""
    return f"{BATCHES_DIR}/{source}"


def batch_manifest(source: str, seq: int) -> str:
    """One batch manifest: ``ingest/batches/<source>/<seq:05d>.json``."""
    return f"{batches_dir(source)}/{seq:05d}.json"


def subset_dir(recipe: str, subset_id: str) -> str:
    """A curated subset's folder."""
    return f"{CURATED_DIR}/{recipe}/{subset_id}"


def subset_manifest(recipe: str, subset_id: str) -> str:
    """A curated subset's ``subset.json``."""
    return f"{subset_dir(recipe, subset_id)}/{SUBSET_MANIFEST}"


def subset_ids(recipe: str, subset_id: str) -> str:
    """A curated subset's ``ids.parquet``."""
    return f"{subset_dir(recipe, subset_id)}/{SUBSET_IDS}"


def recipe_shards_dir(recipe: str) -> str:
    """Where a recipe's shard sets live."""
    return f"{MDS_DIR}/{recipe}"


def shard_set_dir(recipe: str, shard_set_id: str) -> str:
    """A published shard set's folder (a StreamingDataset root)."""
    return f"{recipe_shards_dir(recipe)}/{shard_set_id}"


def shard_set_manifest(recipe: str, shard_set_id: str) -> str:
    """A published shard set's ``manifest.json`` (written last: its presence means complete)."""
    return f"{shard_set_dir(recipe, shard_set_id)}/{SHARD_SET_MANIFEST}"


def shard_set_staging(recipe: str, shard_set_id: str, token: str) -> str:
    """A local staging folder beside the final one (renamed into place on publish)."""
    return f"{recipe_shards_dir(recipe)}/.staging-{shard_set_id}-{token}"


def withdrawal(recipe: str, shard_set_id: str) -> str:
    """The withdrawal record of a shard set (see :mod:`prx_assets.core.publish.tombstone`)."""
    return f"{shard_set_dir(recipe, shard_set_id)}/{WITHDRAWN_FILE}"


def erasure(request_id: str) -> str:
    """What the erasure of one opt-out request removed, and where from."""
    return f"{ERASED_DIR}/{request_id}.json"


def manifest_of(folder_or_manifest: str) -> str:
    """The ``manifest.json`` of a shard-set folder or URI (unchanged when it already names one)."""
    if folder_or_manifest.endswith(SHARD_SET_MANIFEST):
        return folder_or_manifest
    return f"{folder_or_manifest.rstrip('/')}/{SHARD_SET_MANIFEST}"


def training_record(mixture: str, version: str, work_key: str) -> str:
    """What a finished training run of a mixture version with given trainer settings (``work_key``)
    produced: ``training/<mixture>/<version>/trained-<work key>.json``."""
    return f"{TRAINING_DIR}/{mixture}/{version}/trained-{work_key}.json"


def mixture_spec(mixture: str, version: str) -> str:
    """A resolved mixture spec: ``mixtures/<mixture>/<version>.json``."""
    return f"{MIXTURE_DIR}/{mixture}/{version}.json"


def optout_request(request_id: str) -> str:
    """One recorded opt-out request."""
    return f"{OPTOUT_DIR}/{request_id}.json"


def training_dir(mixture: str, version: str) -> str:
    """Checkpoints of the training runs on one mixture version."""
    return f"{TRAINING_DIR}/{mixture}/{version}"


def lease_dir(name: str) -> str:
    """The generations of one writer lease: ``leases/<name>/``."""
    return f"{LEASES_DIR}/{name}"


def search_model(recipe: str, key: str, generation: int) -> str:
    """A recipe's kept embedding-dedup search model of one size generation (see
    :mod:`prx_assets.core.curate.search_models`)."""
    return f"{CURATED_DIR}/{recipe}/_search/{key}-g{generation:02d}.npz"


#: Embedding dedup's kept search codes, one folder per lab column (see :mod:`prx_assets.core.curate.search_codes`).
SEARCH_CODES_DIR = f"{CURATED_DIR}/_codes"


def search_codes_dir(column: str) -> str:
    """Embedding dedup's kept search codes of one lab column, shared by every recipe."""
    return f"{SEARCH_CODES_DIR}/{column}"


def search_codes(column: str, key: str, data_file: str) -> str:
    """The kept search codes of one Lance data file of ``column`` (``data_file``: its name less ``.lance``).

    >>> search_codes("emb__e_1", "ab12", "0101f3")
    'curated/_codes/emb__e_1/ab12/0101f3.npz'
    """
    return f"{search_codes_dir(column)}/{key}/{data_file}.npz"


def search_cells(column: str, key: str, data_file: str, model_id: str, table: int) -> str:
    """The kept multi-index cells of one Lance data file's codes (:func:`search_codes`) in table ``table``
    of the search model ``model_id``, beside the codes (a file of them goes when its data file goes).

    >>> search_cells("emb__e_1", "ab12", "0101f3", "9c0e1d2f3a4b", 1)
    'curated/_codes/emb__e_1/ab12/0101f3.cells-9c0e1d2f3a4b-1.npy'
    """
    return f"{search_codes_dir(column)}/{key}/{data_file}.cells-{model_id}-{table}.npy"


def phash_pairs(recipe: str, version: int, distance: int) -> str:
    """A recipe's kept pHash dedup pairs at one distance (see :mod:`prx_assets.core.curate.phash_pairs`),
    beside its search model and pairs; a cut keeps only its own.

    >>> phash_pairs("r", 1, 4)
    'curated/r/_search/phash-v1-d4.npz'
    """
    return f"{CURATED_DIR}/{recipe}/_search/phash-v{version}-d{distance}.npz"


#: Candidates' content digests kept per fragment's data files (see :mod:`prx_assets.core.curate.kept_digests`).
KEPT_DIGESTS_DIR = f"{CURATED_DIR}/_digests"


def kept_digests_dir(columns: str) -> str:
    """The kept content digests over one set of caption columns (``columns``: its folder name)."""
    return f"{KEPT_DIGESTS_DIR}/{columns}"


def kept_digests(columns: str, key: str) -> str:
    """The kept content digests of one fragment's data files over one set of caption columns.

    >>> kept_digests("caption__c_1", "0a1b2c")
    'curated/_digests/caption__c_1/0a1b2c.npz'
    """
    return f"{kept_digests_dir(columns)}/{key}.npz"


def search_pairs(recipe: str, version: int, codes_key: str, model_id: str, threshold: float) -> str:
    """A recipe's kept embedding-dedup candidate pairs (see :mod:`prx_assets.core.curate.search_pairs`):
    one file per file layout ``version``, search codes key, search model and candidate threshold; a
    cut keeps only its own.

    >>> search_pairs("r", 1, "ab12", "9c0e1d2f3a4b", 0.87)
    'curated/r/_search/pairs-v1-ab12-9c0e1d2f3a4b-0.870000.npz'
    """
    return f"{CURATED_DIR}/{recipe}/_search/pairs-v{version}-{codes_key}-{model_id}-{threshold:.6f}.npz"
