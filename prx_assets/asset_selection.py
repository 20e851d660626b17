"""``--select``: Dagster's asset selection syntax, plus a list of selections separated by commas or
spaces (``'recaptions image_embeddings'``, ``raw_images+,lance_table``), with one-line errors that
name the bad part and suggest the nearest asset names."""

from __future__ import annotations

import difflib
import re

import dagster as dg

from prx_assets.errors import PrxError

#: Words and characters of Dagster's selection grammar beyond names and graph steps: a string with
#: any of them is handed to Dagster whole.
_GRAMMAR = re.compile(r"\b(?:or|and|not)\b|[:()\"]")


class SelectionError(PrxError):
    """A ``--select`` that names no asset or does not parse."""


def parts(select: str) -> list[str]:
    """The selections ``select`` lists (one, unless it is a list of names and graph steps).

    >>> parts("recaptions image_embeddings"), parts("raw_images+, lance_table"), parts("key:raw* or lance_table")
    (['recaptions', 'image_embeddings'], ['raw_images+', 'lance_table'], ['key:raw* or lance_table'])
    """
    text = select.strip()
    if not text or _GRAMMAR.search(text):
        return [text]
    return [p for p in re.split(r"[\s,]+", text) if p]


def resolve(graph: dg.AssetGraph, select: str) -> set[dg.AssetKey]:
    """The asset keys ``select`` names.

    Raises
    ------
    SelectionError
        Naming the part that names no asset (with the nearest names) or does not parse.
    """
    names = sorted(k.to_user_string() for k in graph.get_all_asset_keys())
    keys: set[dg.AssetKey] = set()
    for part in parts(select):
        bare = part.strip("+*")
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_/]*", bare) and bare not in names:
            near = difflib.get_close_matches(bare, names, n=3)
            raise SelectionError(f"--select {select!r}: no asset named {bare!r}"
                                 + (f" (did you mean {' or '.join(near)}?)" if near else "")
                                 + f"; assets: {', '.join(names)}")
        try:
            keys |= set(dg.AssetSelection.from_string(part).resolve(graph))
        except (dg.DagsterError, ValueError) as e:  # the grammar's own errors (DagsterInvalidAssetSelectionError)
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise SelectionError(f"--select {select!r}: {part!r} is not an asset selection ({first}); use asset "
                                 "names separated by spaces or commas, or Dagster's syntax, e.g. 'raw_images+' or "
                                 "'key:recaptions or key:image_embeddings'") from None
    if not keys:
        raise SelectionError(f"--select {select!r} selects no asset; assets: {', '.join(names)}")
    return keys
