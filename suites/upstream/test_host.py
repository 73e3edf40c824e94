"""The upstream host (``harness.upstream.host``): rebinds installed for one run and put
back in reverse order, also on error; one hosted run at a time; and a run of upstream's
code, virtual-time or served, leaves nothing rebound behind it."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

from harness.upstream import host
from harness.upstream.seams import TreeReport

EVERY_TREE = TreeReport(tree=Path("no-tree"), probes=[])  # the rebinds below probe themselves


class _Run:
    def __init__(self, name: str) -> None:
        self.name = name


class _Logged:
    """An object whose attribute assignments and deletions are logged."""

    def __init__(self) -> None:
        object.__setattr__(self, "log", [])
        object.__setattr__(self, "post", "upstream's post")

    def __setattr__(self, name: str, value: Any) -> None:
        self.log.append(("set", name, value))
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        self.log.append(("del", name))
        object.__delattr__(self, name)


def _rebind(owner: Any, attr: str, make: Any, seam: str = "http_post(single_turn)") -> host.Rebind:
    return host.Rebind(seam, lambda: owner, attr, make, probe=lambda report: True)


def test_rebinds_install_in_order_and_restore_in_reverse_order():
    obj = _Logged()
    first = _rebind(obj, "post", lambda post: f"a({post})")
    second = _rebind(obj, "post", lambda post: f"b({post})")
    with host.installed(_Run("r"), [first, second], EVERY_TREE):
        assert obj.post == "b(a(upstream's post))"
        assert host.holder().name == "r"
    assert obj.post == "upstream's post"
    assert [v for _, _, v in obj.log] == [
        "a(upstream's post)",
        "b(a(upstream's post))",
        "a(upstream's post)",  # the second one's restore first
        "upstream's post",
    ]
    assert host.holder() is None


def test_an_error_in_the_run_restores_every_rebind_and_frees_the_host():
    mod = types.ModuleType("fake_upstream")
    mod.post, mod.get = "post", "get"
    rebinds = [_rebind(mod, "post", lambda _: "stand-in post"), _rebind(mod, "get", lambda _: "stand-in get")]
    with pytest.raises(LookupError, match="the run failed"):
        with host.installed(_Run("failing"), rebinds, EVERY_TREE):
            assert (mod.post, mod.get) == ("stand-in post", "stand-in get")
            raise LookupError("the run failed")
    assert (mod.post, mod.get) == ("post", "get") and host.holder() is None


def test_an_install_that_fails_restores_those_installed_before_it():
    mod = types.ModuleType("fake_upstream")
    mod.post = "post"

    def broken(_: Any) -> Any:
        raise RuntimeError("the replacement cannot be made")

    with pytest.raises(RuntimeError, match="cannot be made"):
        with host.installed(_Run("r"), [_rebind(mod, "post", lambda _: "x"), _rebind(mod, "get", broken)], EVERY_TREE):
            pytest.fail("the run must not start")
    assert mod.post == "post" and not hasattr(mod, "get") and host.holder() is None


def test_a_rebind_whose_probe_says_no_leaves_the_name_as_upstream_has_it():
    mod = types.ModuleType("fake_upstream")
    mod.post = "post"
    skipped = host.Rebind("tqdm", lambda: mod, "post", lambda _: "x", probe=lambda report: False)
    with host.installed(_Run("r"), [skipped], EVERY_TREE):
        assert mod.post == "post"


def test_an_attribute_the_owner_inherits_is_deleted_again_not_copied_onto_it():
    class Lifecycle:
        sink = None

    obj = Lifecycle()
    with host.installed(
        _Run("r"), [_rebind(obj, "sink", lambda _: "run's sink", seam="trajectory_lifecycle")], EVERY_TREE
    ):
        assert obj.sink == "run's sink"
    assert "sink" not in vars(obj) and obj.sink is None


def test_a_second_run_while_one_holds_the_host_is_refused_naming_both():
    with host.installed(_Run("first"), [], EVERY_TREE):
        with pytest.raises(host.HostBusy, match=r"cannot host _Run 'second': _Run 'first' holds the upstream host"):
            with host.installed(_Run("second"), [], EVERY_TREE):
                pytest.fail("the second run must not start")
        assert host.holder().name == "first"  # the refusal does not free the host
    assert host.holder() is None


def test_a_rebind_names_a_registered_seam():
    with pytest.raises(ValueError, match=r"Rebind seam='no-such-seam' is not a seam of harness.upstream.seams.SEAMS"):
        host.Rebind("no-such-seam", lambda: None, "x", lambda _: None)


def test_outside_a_run_a_path_loaded_target_is_a_leaf_call():
    from harness.upstream.leaf_fakes import LeafCalled

    with pytest.raises(LeafCalled, match="outside a hosted run"):
        host.current()


# --------------------------------------------------------------------------- on upstream's code


def _rebound(rebinds: list[host.Rebind]) -> dict[tuple[str, str], Any]:
    """What each rebind's name holds now, by owner and attribute."""
    return {(repr(r.owner()), r.attr): vars(r.owner()).get(r.attr) for r in rebinds}


def _scenario(name: str) -> Any:
    from harness.upstream.diff import case_named

    return case_named(name).scenario()


def test_a_virtual_time_run_leaves_nothing_rebound_and_no_state_behind(miles_src):
    from harness.upstream import runner

    names = _rebound(runner.virtual_time_rebinds(runner.UpstreamRunner(_scenario("one-step-k2"))))
    globals_before = {k: v for k, v in vars(runner).items() if not k.startswith("__")}
    alone = runner.run_upstream(_scenario("fa-group-k2"))
    runner.run_upstream(_scenario("one-step-k2"))
    again = runner.run_upstream(_scenario("fa-group-k2"))
    assert _rebound(runner.virtual_time_rebinds(runner.UpstreamRunner(_scenario("one-step-k2")))) == names
    assert host.trajectory_lifecycle().sink is None and host.holder() is None
    assert {k: v for k, v in vars(runner).items() if not k.startswith("__")} == globals_before
    # a run after another one is the run alone
    assert [e.to_json() for e in again.events] == [e.to_json() for e in alone.events]
    assert again.history == alone.history


def test_a_virtual_time_run_that_raises_restores_upstream(miles_src, monkeypatch):
    from harness.upstream import runner

    names = _rebound(runner.virtual_time_rebinds(runner.UpstreamRunner(_scenario("sync"))))

    def fails(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the args cannot be built")

    monkeypatch.setattr(runner, "upstream_args", fails)
    with pytest.raises(RuntimeError, match="cannot be built"):
        runner.run_upstream(_scenario("sync"))
    assert _rebound(runner.virtual_time_rebinds(runner.UpstreamRunner(_scenario("sync")))) == names
    assert host.trajectory_lifecycle().sink is None and host.holder() is None


def test_a_virtual_time_run_inside_a_served_run_is_refused(miles_src):
    from harness.serve.upstream_e2e import _Observer, e2e_rebinds
    from harness.upstream import runner

    single_turn = sys.modules["miles.rollout.generate_hub.single_turn"]
    post = single_turn.post
    observer = _Observer(post)
    with host.installed(_Run("served"), e2e_rebinds(observer)):
        assert single_turn.post == observer.post and host.trajectory_lifecycle().sink is observer.sink
        with pytest.raises(host.HostBusy, match="_Run 'served' holds the upstream host"):
            runner.run_upstream(_scenario("sync"))
    assert single_turn.post is post and host.trajectory_lifecycle().sink is None
