"""Caption quality: flag empty, too short, truncated and degenerate captions.

- ``empty``: nothing but whitespace.
- ``too_short``: fewer than ``min_words`` words.
- ``truncated``: generation stopped at ``max_new_tokens`` instead of ending by itself.
- ``degenerate``: a repetition loop — a word n-gram (n = 1..4) repeated back to back
  ``min_repeats`` times or more, one character repeated 10+ times, or a long caption with
  very few distinct words.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

FLAGS = ("empty", "too_short", "truncated", "degenerate")
LENGTH_BINS = (0, 1, 5, 10, 20, 40, 80, 160, 320)


def _words(text: str) -> list[str]:
    return re.findall(r"\S+", text.lower())


def is_degenerate(text: str, min_repeats: int = 4, min_distinct_ratio: float = 0.3) -> bool:
    """True for repetition loops (see module docs).

    >>> is_degenerate("a cat on a mat")
    False
    >>> is_degenerate("the the the the the")
    True
    >>> is_degenerate("a red car a red car a red car a red car")
    True
    """
    if re.search(r"(.)\1{9,}", text):
        return True
    words = _words(text)
    for n in range(1, 5):
        for offset in range(n):  # a loop may start anywhere within an n-gram
            run = 1
            for i in range(offset + n, len(words) - n + 1, n):
                if words[i:i + n] == words[i - n:i]:
                    run += 1
                    if run >= min_repeats:
                        return True
                else:
                    run = 1
    return len(words) >= 16 and len(set(words)) / len(words) < min_distinct_ratio


def flags_for(text: str, hit_max_tokens: bool, min_words: int = 5) -> list[str]:
    """The quality flags of one caption."""
    out = []
    words = _words(text)
    if not words:
        return ["empty"]
    if len(words) < min_words:
        out.append("too_short")
    if hit_max_tokens:
        out.append("truncated")
    if is_degenerate(text):
        out.append("degenerate")
    return out


@dataclass
class QualityReport:
    """Flag counts, a length histogram and examples over a set of captions."""

    total: int = 0
    flagged: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    lengths: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    mean_words: float = 0.0

    @property
    def flagged_fraction(self) -> float:
        """Share of captions with at least one flag."""
        return self.flagged / self.total if self.total else 0.0

    def to_metadata(self) -> dict[str, Any]:
        """Plain values for reports."""
        return {"total": self.total, "flagged": self.flagged,
                "flagged_fraction": round(self.flagged_fraction, 4),
                "counts": {f: self.counts.get(f, 0) for f in FLAGS},
                "length_histogram_words": dict(self.lengths), "mean_words": round(self.mean_words, 2),
                "examples": self.examples}


def _bin(n: int) -> str:
    for lo, hi in itertools.pairwise(LENGTH_BINS):
        if lo <= n < hi:
            return f"{lo}-{hi - 1}"
    return f"{LENGTH_BINS[-1]}+"


def assess(captions: list[tuple[str, bool]], min_words: int = 5, examples_per_flag: int = 3) -> QualityReport:
    """Assess ``(caption, hit_max_tokens)`` pairs."""
    rep = QualityReport(total=len(captions))
    rep.lengths = Counter({_bin(lo): 0 for lo in LENGTH_BINS})
    total_words = 0
    for text, hit_max in captions:
        n = len(_words(text))
        total_words += n
        rep.lengths[_bin(n)] += 1
        flags = flags_for(text, hit_max, min_words)
        if flags:
            rep.flagged += 1
        for f in flags:
            rep.counts[f] += 1
            ex = rep.examples.setdefault(f, [])
            if len(ex) < examples_per_flag:
                ex.append(text[:200])
    rep.mean_words = total_words / len(captions) if captions else 0.0
    return rep
