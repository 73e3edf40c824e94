"""The gate's cases for the flags a pull request adds or gives another default, read from
two versions of ``miles/utils/arguments.py`` written here (nothing is imported)."""

from __future__ import annotations

from harness.upstream.flag_cases import changes, flags, specs, value_for

BASE = """
def add(parser):
    parser.add_argument("--old-flag", action="store_true", default=False)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--mode", type=str, choices=["a", "b"], default="a")
"""

HEAD = (
    BASE.replace("default=3)", "default=4)")
    + """
    parser.add_argument("--new-flag", action="store_true")
    parser.add_argument("--no-thing", action="store_false", dest="thing")
    parser.add_argument("--ratio", type=float, default=0.5)
    parser.add_argument("--name", type=str, default="x")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1])
    parser.add_argument("--fn", type=str, default=DEFAULT_FN)
"""
)


def test_each_add_argument_call_is_read_with_its_dest_default_and_choices():
    found = flags(HEAD)
    assert found["--no-thing"].dest == "thing" and found["--no-thing"].default is True
    assert found["--mode"].choices == ("a", "b") and found["--mode"].default == "a"
    assert found["--new-flag"].dest == "new_flag" and found["--new-flag"].default is False
    assert flags("def broken(:\n") == {}


def test_a_case_sets_a_boolean_another_choice_or_another_number_and_skips_the_rest_with_the_reason():
    found = flags(HEAD)
    assert value_for(found["--new-flag"]) == (True, None)
    assert value_for(found["--no-thing"]) == (False, None)
    assert value_for(found["--mode"]) == ("b", None)
    assert value_for(found["--steps"]) == (5, None)
    assert value_for(found["--ratio"]) == (1.0, None)
    value, why = value_for(found["--name"])
    assert value is None and why == "not a boolean, a choice or a number (default 'x'): no value to set it to"
    assert value_for(found["--sizes"])[1] == "takes a list (nargs='+'): no value to set it to"


def test_only_new_flags_and_changed_defaults_get_cases_new_ones_set_on_head_only():
    found = {c.flag.option: c for c in changes(HEAD, BASE)}
    assert set(found) == {"--steps", "--new-flag", "--no-thing", "--ratio", "--name", "--sizes", "--fn"}
    assert found["--steps"].text() == "--steps (default 3 -> 4): set to 5 on both trees"
    assert found["--new-flag"].text() == (
        "--new-flag (new): set to true on HEAD; BASE, which lacks it, runs each case without it"
    )
    assert found["--fn"].skip and found["--fn"].text().startswith("--fn (new): no case: not a boolean")
    cases = specs([found["--steps"], found["--new-flag"], found["--fn"]], ["sync", "one-step-k1"])
    assert [c["name"] for c in cases] == [
        "flag--steps=5@sync",
        "flag--steps=5@one-step-k1",
        "flag--new-flag=true@sync",
        "flag--new-flag=true@one-step-k1",
    ]
    assert cases[0]["set"] == {"head": True, "base": True} and cases[2]["set"] == {"head": True, "base": False}
    assert changes(BASE, BASE) == []
