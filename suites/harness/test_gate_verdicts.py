"""The gate's verdict on one case is a pure function of the case's two records (HEAD and
BASE, as ``harness.upstream.gate_run`` writes them): these tests build the records by
hand, so every verdict, the exit code and the summary are checked without a Miles tree.
Also here: the per-case log capture and the leaf-fake attribute check the gate and
``diff-upstream`` share."""

from __future__ import annotations

import argparse
import logging

from harness.upstream import gate
from harness.upstream.case_log import captured, tail
from harness.upstream.judge import leaf_failure


def obs(trained: tuple = (0, 1, 2, 3)) -> dict:
    return {"trained": [[1.5, [0, list(trained)]]], "end": [[9.0, [9.0, None]]]}


def ran(
    name: str = "case",
    *,
    broken: tuple = (),
    trained: tuple = (0, 1, 2, 3),
    findings: tuple = (),
    complete: bool = True,
) -> dict:
    checkers = {"conservation": 0, "buffer_capacity": 0, "drain_shape": 0}
    for b in broken:
        checkers[b] = 2
    return {
        "name": name,
        "status": "ran",
        "error": None,
        "observables": obs(trained),
        "findings": list(findings),
        "judgement": {
            "complete": complete,
            "checkers": checkers,
            "broken": list(broken),
            "violations": [{"invariant": b, "message": f"{b} broken at t=3"} for b in broken],
        },
        "log": "INFO:miles:a line of upstream's log",
    }


def harness_error(name: str = "case", message: str = "harness_error: upstream calls `x` on a leaf fake") -> dict:
    return {"name": name, "status": "harness_error", "seams": ["leaf"], "message": message, "log": ""}


def not_run(name: str = "case") -> dict:
    return {"name": name, "status": "not_run", "seams": ["make_submission_scheduler(fully-async)"], "message": "m"}


def test_the_same_run_on_both_trees_is_unchanged():
    v = gate.classify(ran(), ran())
    assert v.verdict == "unchanged" and "every invariant holds (3 checkers)" in v.message


def test_a_different_run_with_every_invariant_holding_is_changed():
    v = gate.classify(ran(trained=(0, 1, 4, 7)), ran())
    assert v.verdict == "changed"
    assert "every invariant holds" in v.message and v.first_change.startswith("trained[0]")


def test_a_violation_only_head_has_is_new():
    v = gate.classify(ran(broken=("buffer_capacity",)), ran())
    assert v.verdict == "new_violation" and v.new == ["buffer_capacity"]
    assert "HEAD breaks buffer_capacity, BASE does not" in v.message
    assert v.details == ["buffer_capacity broken at t=3"]


def test_the_same_violation_on_both_trees_is_old_not_new():
    same = gate.classify(ran(broken=("buffer_capacity",)), ran(broken=("buffer_capacity",)))
    assert same.verdict == "unchanged" and same.old == ["buffer_capacity"] and not same.new
    moved = gate.classify(ran(broken=("buffer_capacity",), trained=(0, 2, 4, 6)), ran(broken=("buffer_capacity",)))
    assert moved.verdict == "changed" and "breaks only what BASE breaks too: buffer_capacity (old)" in moved.message


def test_a_second_violation_beside_an_old_one_is_new():
    v = gate.classify(ran(broken=("buffer_capacity", "conservation")), ran(broken=("buffer_capacity",)))
    assert v.verdict == "new_violation" and v.new == ["conservation"] and v.old == ["buffer_capacity"]


def test_a_violation_only_base_has_is_fixed():
    v = gate.classify(ran(), ran(broken=("drain_shape",)))
    assert v.verdict == "fixed" and v.fixed == ["drain_shape"]


def test_harness_errors_and_missing_seams_are_never_findings():
    assert gate.classify(harness_error(), ran()).verdict == "harness_error"
    # a seam HEAD lost where BASE ran: the pull request goes unchecked there
    lost = gate.classify(not_run(), ran())
    assert lost.verdict == "harness_error" and "the harness cannot host HEAD here, though it ran BASE" in lost.message
    assert "make_submission_scheduler" in lost.message
    assert gate.classify(not_run(), not_run()).verdict == "not_run"


def test_a_case_base_could_not_run_is_no_base_and_never_a_finding():
    for base in (not_run(), harness_error()):
        for head in (ran(), ran(broken=("conservation",))):
            v = gate.classify(head, base)
            assert v.verdict == "no_base" and v.message.startswith("BASE could not run it"), v
    said = gate.classify(ran(broken=("conservation",)), not_run()).message
    assert "HEAD breaks conservation on its own trace" in said
    assert gate.exit_code([gate.classify(ran(broken=("conservation",)), harness_error())]) != 1


def dead(name: str = "case", error: str = "RuntimeError: dies at start-up") -> dict:
    rec = ran(name, complete=False)
    return dict(rec, error=error.split(":")[0], error_message=error, error_at="train_async.py:L27", started=False)


def test_a_run_that_did_not_start_is_no_prefix_to_judge():
    v = gate.classify(dead(), dict(ran(), started=True))
    assert v.verdict == "not_started" and "every invariant holds" not in v.message
    assert "RuntimeError: dies at start-up at train_async.py:L27" in v.message
    assert gate.exit_code([v]) == 1
    assert gate.classify(dict(ran(), started=True), dead()).verdict == "no_base"


def test_a_run_that_ends_with_an_error_where_base_ran_to_its_end_is_a_new_violation():
    """Judged as a prefix, HEAD's run holds every invariant up to its error; the error
    itself is what is new (a matrix case: a drawn schedule's errors are the sweep's)."""
    crashed = dict(
        ran(trained=(0, 1), complete=False),
        error="RuntimeError",
        error_message="RuntimeError: does not support durable source reservations",
        error_at="miles/rollout/data_source.py:L619",
        started=True,
    )
    v = gate.classify(crashed, dict(ran(), started=True))
    assert v.verdict == "new_violation" and v.new == ["run_error:RuntimeError"], v
    assert v.details == [
        "HEAD's run ended with RuntimeError: does not support durable source reservations at "
        "miles/rollout/data_source.py:L619; BASE's ran to its end"
    ]
    injected = dict(crashed, error="TrainerStepError", error_message="TrainerStepError: injected", error_at=None)
    before = gate.classify(crashed, injected)
    assert (
        before.new == ["run_error:RuntimeError"] and "BASE's ended with TrainerStepError: injected" in before.details[0]
    )
    both = gate.classify(crashed, dict(crashed, trained=(0, 1)))
    assert both.verdict in ("unchanged", "changed") and not both.new
    drawn = gate.classify(dict(crashed, mode="fully_async"), dict(ran(), started=True, mode="fully_async"))
    assert "run_error:RuntimeError" not in drawn.new  # the fault sweep's findings say it there


def test_a_case_neither_tree_started_is_unchecked_never_a_pass():
    """Both runs die at start-up with the same error: nothing of the case ran on either
    tree, so it is neither unchanged nor changed, and the gate cannot exit 0 on it."""
    both = gate.classify(dead(), dead())
    assert both.verdict == "neither_started", both
    assert both.message.startswith("neither tree's run started, nothing was checked: both raise RuntimeError")
    other = gate.classify(dead(), dead(error="NameError: x"))
    assert other.verdict == "neither_started" and "HEAD RuntimeError: dies at start-up" in other.message
    fine = gate.classify(dict(ran(), started=True), dict(ran(), started=True))
    assert fine.verdict == "unchanged"
    assert gate.exit_code([fine, both]) == gate.Exit.UNCHECKED == 4
    assert gate.exit_code([fine, both], accept_unrun=True) == 0
    assert gate.exit_code([both]) == 3  # no case compared at all
    assert gate.exit_code([both, gate.classify(dead(), dict(ran(), started=True))]) == 1  # a finding wins
    assert gate.counts_line([fine, both]) == (
        "2 cases: 0 new violation, 0 did not start, 1 neither started, 0 harness error, 0 changed, "
        "0 violation fixed, 0 no base, 0 not run, 1 unchanged"
    )
    line = gate.headline([fine, both], gate.Exit.UNCHECKED)
    assert line == "exit 4: nothing new is violated, but in 1 case(s) neither tree's run started (unchecked)"
    md = gate.summary_markdown([fine, both], head="h", base="b", code=gate.Exit.UNCHECKED, wall_s=1, cpu_s=1)
    assert md.startswith("## Miles async gate: UNCHECKED") and "| neither started | 1 |" in md
    assert "### Runs that started on neither tree" in md and "`case`: neither tree's run started" in md


def test_a_refusal_case_both_trees_refuse_is_unchanged_the_refusal_being_what_it_checks():
    refused = dead(error="AssertionError: Colocation is not supported for async training.")
    v = gate.classify(dict(refused, refusal=True), dict(refused, refusal=True))
    assert v.verdict == "unchanged" and v.message.startswith("both trees refuse it at start-up, as the case expects")
    other = gate.classify(dict(refused, refusal=True), dict(dead(), refusal=True))
    assert other.verdict == "changed" and "refuse it at start-up, differently" in other.message
    assert gate.exit_code([v]) == 0
    from harness.upstream.diff import matrix

    assert {c.name for c in matrix() if c.refused} == {
        "one-step-colocate",
        "fa-colocate",
        "one-step-critic-no-correction",
        "fa-critic-no-correction",
    }


def test_the_first_screen_lists_cases_neither_tree_started(capsys):
    from harness.commands.gate import _print_verdicts

    both = [gate.classify(dead(n), dead(n)) for n in ("a", "b")]
    _print_verdicts([gate.classify(ran("c"), ran("c")), *both], verbose=False)
    out = capsys.readouterr().out
    assert out.startswith("NEITHER STARTED in 2 case(s) (a, b): neither tree's run started, nothing was checked")


def test_zero_cases_compared_never_exits_0():
    assert gate.exit_code([]) == 3
    assert gate.exit_code([gate.classify(not_run(), not_run()), gate.classify(ran(), not_run())]) == 3


def test_a_fault_sweep_finding_base_shows_under_another_schedule_is_old():
    drop = {
        "kind": "silent_drop:failed_group_discarded",
        "sweep_kind": "silent_drop:failed_group_discarded@sync",
        "message": "groups [3] failed and were discarded",
    }
    head = [ran("fault-seed-1", findings=(drop,), trained=(1, 2, 4, 5)), ran("fault-seed-2")]
    base = [ran("fault-seed-1"), ran("fault-seed-2", findings=(drop,))]
    first = gate.classify_all(head, base)[0]
    assert first.verdict == "changed" and first.elsewhere == ["silent_drop:failed_group_discarded"]
    assert "BASE shows it in fault-seed-2" in first.message
    # an invariant a drawn schedule breaks on HEAD only, which BASE breaks under another schedule of the same
    # driver, is old; under another driver, or in a matrix case (no driver recorded), it is new
    cap = dict(ran("fault-seed-3", broken=("buffer_capacity",)), mode="fully_async")
    base_cap = [
        dict(ran("fault-seed-3"), mode="fully_async"),
        dict(ran("fault-seed-4", broken=("buffer_capacity",)), mode="fully_async"),
    ]
    assert gate.classify_all([cap], base_cap)[0].elsewhere == ["buffer_capacity"]
    assert gate.classify_all([dict(cap, mode="one_step")], base_cap)[0].verdict == "new_violation"
    assert gate.classify_all([ran("fault-seed-3", broken=("buffer_capacity",))], base_cap)[0].verdict == "new_violation"
    # the other way round: gone from one drawn schedule but shown under another on HEAD is not fixed
    moved = gate.classify_all(
        [
            dict(ran("fault-seed-3", trained=(0, 2)), mode="fully_async"),
            dict(ran("fault-seed-4", broken=("buffer_capacity",)), mode="fully_async"),
        ],
        [
            dict(ran("fault-seed-3", broken=("buffer_capacity",)), mode="fully_async"),
            dict(ran("fault-seed-4", broken=("buffer_capacity",)), mode="fully_async"),
        ],
    )
    assert moved[0].verdict == "changed" and "not fixed: HEAD shows it in fault-seed-4" in moved[0].message
    # a finding kind BASE never shows is new
    hang = {"kind": "hang:watchdog hang", "sweep_kind": "hang:watchdog hang@sync", "message": "no progress"}
    assert (
        gate.classify_all([ran("fault-seed-1", findings=(hang,))], [ran("fault-seed-1")])[0].verdict == "new_violation"
    )


def test_times_alone_changing_is_a_change_said_as_such():
    head, base = ran(), ran()
    head["observables"]["end"] = [[9.5, [9.0, None]]]
    v = gate.classify(head, base)
    assert v.verdict == "changed" and "at another time" in v.first_change


def test_exit_codes():
    new, err, changed, same = (
        gate.CaseVerdict("a", k, "") for k in ("new_violation", "harness_error", "changed", "unchanged")
    )
    assert gate.exit_code([same, changed]) == 0
    assert gate.exit_code([same, changed], strict=True) == 1
    assert gate.exit_code([same, err]) == 2
    assert gate.exit_code([err, new]) == 1  # a new violation is a finding whatever else happened
    assert gate.exit_code([gate.CaseVerdict("a", "fixed", ""), gate.CaseVerdict("b", "not_run", "")]) == 0


def test_summary_groups_repeated_harness_errors_and_shows_a_new_violation_with_its_log():
    head = [ran("a", broken=("conservation",)), harness_error("b"), harness_error("c"), ran("d")]
    base = [ran("a"), ran("b"), ran("c"), ran("d")]
    verdicts = gate.classify_all(head, base)
    code = gate.exit_code(verdicts)
    md = gate.summary_markdown(verdicts, head="pr", base="main", code=code, wall_s=12.0, cpu_s=20.0)
    assert md.startswith("## Miles async gate: FAILED")
    assert "| new violation | 1 |" in md and "| harness error | 2 |" in md and "| unchanged | 1 |" in md
    assert "`b`, `c`: on HEAD: harness_error: upstream calls `x` on a leaf fake" in md
    assert "`conservation`: conservation broken at t=3" in md and "a line of upstream's log" in md
    doc = gate.summary_json(
        verdicts, head="pr", base="main", code=code, wall_s=12.0, cpu_s=20.0, strict=False, trees={}
    )
    assert doc["exit"] == 1 and doc["counts"] == {"new_violation": 1, "harness_error": 2, "unchanged": 1}
    assert {c["name"]: c["verdict"] for c in doc["cases"]}["a"] == "new_violation"


def test_captured_takes_logging_and_prints_and_restores_the_handlers(capsys):
    root = logging.getLogger()
    before = root.handlers[:]
    with captured() as buf:
        logging.getLogger("miles.rollout").warning("a group failed")
        print("printed by upstream")
    assert "WARNING:miles.rollout:a group failed" in buf.getvalue() and "printed by upstream" in buf.getvalue()
    assert root.handlers == before
    assert "a group failed" not in capsys.readouterr().out


def test_tail_says_how_much_it_left_out():
    assert tail("\n".join(str(i) for i in range(50)), 5).splitlines()[0] == "... 45 earlier lines in the log file"


class _StandIn:  # defined in this test module, not in harness: not a leaf fake
    pass


def test_an_attribute_missing_on_a_harness_object_is_named_with_the_line():
    """The lifecycle sink is the harness' object in upstream's hands: a newer Miles calling
    a hook it lacks is the harness' failure, named with the calling line."""
    from harness.upstream.host import LifecycleSink

    sink = LifecycleSink()
    try:
        sink.trajectory_end(object())
    except AttributeError as exc:
        message = leaf_failure(exc)
    assert message is not None and "`trajectory_end`" in message and "LifecycleSink" in message
    assert "test_gate_verdicts.py:L" in message  # the line that called it


def test_the_runners_args_missing_a_flag_is_a_harness_error_and_other_objects_are_not():
    try:
        argparse.Namespace(a=1).rollout_health_check_timeout  # noqa: B018
    except AttributeError as exc:
        assert "`args.rollout_health_check_timeout`" in leaf_failure(exc)
    try:
        _StandIn().missing  # noqa: B018
    except AttributeError as exc:
        assert leaf_failure(exc) is None
    assert leaf_failure(None) is None
    assert leaf_failure(ValueError("x")) is None


def test_a_driver_whose_module_the_tree_lacks_is_not_run_naming_the_module():
    old = dict(
        not_run(),
        seams=["make_submission_scheduler(fully-async)", "submit_one_group"],
        absent=["miles/rollout/fully_async_rollout.py"],
    )
    for base in (ran(), old):
        v = gate.classify(old, base)
        assert v.verdict == "not_run" and "HEAD has no miles/rollout/fully_async_rollout.py" in v.message, v
    # a seam the tree has the file of, but not the member: the harness cannot host HEAD there
    assert gate.classify(dict(old, absent=[]), ran()).verdict == "harness_error"


def test_the_first_screen_line_of_a_new_violation_has_the_invariant_message_slice_and_command():
    head = ran(broken=("buffer_capacity",))
    head["judgement"]["violations"][0]["slice"] = "events #331..#341, t=8.973..9.061 s"
    v = gate.classify(head, ran())
    v.reproduce = gate.reproduce(v.name, "/pr")
    assert v.line() == (
        "case: new violation: buffer_capacity: buffer_capacity broken at t=3 [events #331..#341, t=8.973..9.061 s]; "
        "reproduce: miles-harness diff-upstream --miles-src /pr --scenario case"
    )
    assert gate.reproduce("fault-seed-17", "/pr").endswith("fault_sweep replay 17")


def test_a_first_change_deep_in_a_long_metric_list_shows_the_same_metric_name_on_both_sides():
    names = [f"rollout/fully_async/metric_with_a_long_name_{i}" for i in range(12)]
    base, head = ran(), ran()
    base["observables"]["metrics"] = [[1.0, [0, [[n, 1.0] for n in names]]]]
    head["observables"]["metrics"] = [[1.0, [0, [[n, 1.0 if i != 9 else 2.0] for i, n in enumerate(names)]]]]
    said = gate.first_change(head, base)
    assert said is not None
    b, _, h = said.partition(", head ")
    assert "metric_with_a_long_name_9', 1.0]" in b and "metric_with_a_long_name_9', 2.0]" in h, said


def test_a_flag_case_that_upstreams_argument_checks_refuse_is_not_run_but_a_matrix_case_is_a_finding():
    refused = dict(
        dead("flag--opd-teacher-num-nodes=2@sync", "ValueError: --opd-teacher-num-nodes is set but --use-opd is not"),
        error_at="miles/utils/arguments.py:L3030",
    )
    v = gate.classify(refused, dict(ran("flag--opd-teacher-num-nodes=2@sync"), started=True))
    assert v.verdict == "not_run" and "refuse the flag set alone" in v.message, v
    assert gate.exit_code([v, gate.classify(ran(), ran())]) == 0
    matrix_case = dict(dead("sync", "ValueError: no longer valid"), error_at="miles/utils/arguments.py:L3030")
    assert gate.classify(matrix_case, dict(ran("sync"), started=True)).verdict == "not_started"


def test_the_gates_resume_cases_stop_each_driver_after_a_save_and_between_the_two_saves():
    from harness.upstream import gate_run

    picked = {(c.setting, c.stops[0].label) for c in gate_run.resume_cases()}
    drivers = {setting.split("/")[0] for setting, _ in picked}
    assert drivers == {"sync", "one-step", "fully-async"}
    for setting in {s for s, _ in picked}:
        assert {label for s, label in picked if s == setting} == set(gate_run.RESUME_STOPS)
    names = [n for n, _ in gate_run.cases(["sync"], 0, resume=True)]
    assert names[0] == "sync" and all(n.startswith(gate_run.RESUME_PREFIX) for n in names[1:]) and len(names) == 7


def test_a_change_of_behaviour_reads_as_the_list_of_aspects_that_differ():
    head, base = ran("a"), ran("a")
    head["observables"] = {
        **base.get("observables", {}),
        "end": [[123.0, [123.0, "X"]]],
        "pauses": [[1.0, ["retract", 0]]],
    }
    v = gate.classify(head, base)
    assert v.aspects == [k for k in ("pauses", "end")], v.aspects
    assert gate.aspect_counts([v, gate.classify(ran("b"), ran("b"))]) == [("pauses", 1), ("end", 1)]


def test_a_resume_case_is_reproduced_by_the_resume_sweep_on_heads_tree_for_its_setting():
    from harness.lives.sweep import settings
    from harness.upstream.gate_run import resume_cases

    known = {name for name, _ in settings()}
    for case in resume_cases():
        name = f"resume:{case.setting}:{case.stops[0].label}"
        command = gate.reproduce(name, "/trees/head")
        assert command.startswith("miles-harness resume-sweep --host upstream --miles-src /trees/head --setting ")
        assert command.rsplit("--setting ", 1)[1] in known, command
