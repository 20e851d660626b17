"""Each degenerate kind is caught on crafted captions; good captions pass."""

import pytest

from prx_assets.core.enrich.caption_quality import assess, flags_for, is_degenerate

GOOD = "A red bicycle leaning against a brick wall under warm evening light, with ivy on the left."


@pytest.mark.parametrize(("text", "hit_max", "flags"), [
    (GOOD, False, []),
    ("", False, ["empty"]),
    ("   \n ", False, ["empty"]),
    ("A dog.", False, ["too_short"]),
    (GOOD + " The scene continues with", True, ["truncated"]),
    ("the the the the the the the the", False, ["degenerate"]),
    ("a cat on a sofa a cat on a sofa a cat on a sofa a cat on a sofa", False, ["degenerate"]),
    ("A photo of blue blue blue blue sky over the hills at dawn", False, ["degenerate"]),
    ("Wow!!!!!!!!!!!!!!!!!! what a nice scene with trees", False, ["degenerate"]),
    ("x y " * 20, True, ["truncated", "degenerate"]),
])
def test_flags(text: str, hit_max: bool, flags: list[str]) -> None:
    assert flags_for(text, hit_max) == flags


def test_low_distinct_ratio_is_degenerate_but_repetition_in_prose_is_not() -> None:
    assert is_degenerate(" ".join(["red", "car", "blue", "car"] * 6))
    assert not is_degenerate("A man and a woman and a child walk along a beach and a pier.")


def test_report_counts_histogram_examples() -> None:
    rep = assess([(GOOD, False), ("", False), ("the the the the the", False), ("A dog.", False)])
    md = rep.to_metadata()
    assert md["total"] == 4 and md["flagged"] == 3 and md["flagged_fraction"] == 0.75
    assert md["counts"] == {"empty": 1, "too_short": 1, "truncated": 0, "degenerate": 1}
    assert sum(md["length_histogram_words"].values()) == 4
    assert md["length_histogram_words"]["0-0"] == 1
    assert md["examples"]["degenerate"] == ["the the the the the"]
