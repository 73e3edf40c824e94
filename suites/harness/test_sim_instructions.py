"""harness.results.sim_instructions: instructions and cache misses per simulated sample
under cachegrind, at a base commit and at HEAD (the parsing and arithmetic; the count
itself takes minutes and runs as a `make results` step)."""

from __future__ import annotations

import pytest

from harness.results import sim_instructions
from harness.results.sim_instructions import compare, parse_cachegrind, per_sample

# cachegrind's summary as valgrind 3.19 prints it (the lines this module reads, and others)
SUMMARY = """==31903== I   refs:      3,200,101,927
==31903== I1  misses:        9,976,530
==31903== LLi misses:           38,233
==31903== D   refs:      1,482,744,318  (1,038,271,519 rd   + 444,472,799 wr)
==31903== LL misses:        12,688,390  (   10,675,003 rd   +   2,013,387 wr)
==31903== LL miss rate:            0.3% (          0.3%     +         0.5%  )
"""


def test_the_summary_gives_instructions_and_last_level_misses():
    assert parse_cachegrind(SUMMARY) == {"instructions": 3_200_101_927, "ll_misses": 12_688_390}


def test_a_summary_without_the_counts_says_what_is_missing():
    with pytest.raises(ValueError, match="LL misses"):
        parse_cachegrind(SUMMARY.replace("LL misses:", "LL mishaps:"))


def test_per_sample_is_the_difference_over_the_samples_of_the_extra_steps():
    short, long = (
        {"instructions": 1_000, "ll_misses": 10},
        {"instructions": 1_000 + 4 * 512 * 250, "ll_misses": 10 + 512},
    )
    assert per_sample(short, long, 4) == {"instructions": 250.0, "ll_misses": 0.2}


@pytest.mark.parametrize(
    "kw, message",
    [({"short": 40, "long": 8}, "--short 40 --long 8"), ({"base": "no-such-commit"}, "--base 'no-such-commit'")],
)
def test_bad_arguments_name_the_flag(kw, message):
    with pytest.raises(SystemExit, match=message):
        compare(**{"base": "HEAD", "short": 1, "long": 2, **kw})


def test_without_valgrind_it_says_how_to_get_it(monkeypatch):
    monkeypatch.setattr(sim_instructions.shutil, "which", lambda name: None)
    with pytest.raises(SystemExit, match="apt install valgrind"):
        compare("HEAD", 1, 2)
