"""Every private API of a library that prx_assets still needs, each in one place.

The rest of ``prx_assets/`` uses public APIs only; ``tests/unit/test_compat.py`` parses every
module and fails on a private import or attribute of another package outside this folder. Each
shim here names why no public API does the job, the upstream issue that would let it go, and
the versions it was checked against: its :func:`guard` refuses any other version with the
fix, instead of misbehaving quietly after an upgrade.

- :mod:`.lance`: ``LanceDataset._take_rows`` (rows by row id) and a dataset's storage options.
- :mod:`.streaming`: extra files per stream (sidecar columns), a shard flush at a given sample,
  the shared memory of a dataset, and a ``GCSDownloader`` that pickles.
- :mod:`.pillow`: Pillow's JPEG encoder called directly (the q92 check's cycles).
- :mod:`.dagster_checks`: the latest state of a partitioned blocking check, per partition.
- :mod:`.stdlib`: whether this process is a ``multiprocessing`` child still importing its parent.

Each submodule imports its library lazily or only itself, so a job that imports one of them
does not import the others (the job entry imports no Dagster).
"""

from __future__ import annotations

import functools
from importlib.metadata import PackageNotFoundError, version

from packaging.specifiers import SpecifierSet

from prx_assets.errors import PrxError


class CompatError(PrxError):
    """An installed library is not a version a private-API shim was checked against."""


@functools.cache
def guard(dist: str, checked: str, what: str, upstream: str) -> None:
    """Refuse a version of ``dist`` outside ``checked`` (a PEP 440 specifier) for the shim ``what``.

    ``upstream`` names the issue that would make the shim unnecessary; the error says what to do.
    """
    try:
        installed = version(dist)
    except PackageNotFoundError:
        raise CompatError(f"{what} needs {dist}, which is not installed; pip install '{dist}{checked}'") from None
    if installed not in SpecifierSet(checked):
        raise CompatError(
            f"{what} uses a private API of {dist}, checked against {dist}{checked}; {installed} is installed. "
            f"Install '{dist}{checked}', or check {upstream} and the shim in prx_assets/compat/ against "
            f"{installed} and widen its range")
