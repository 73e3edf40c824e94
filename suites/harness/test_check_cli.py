"""`miles-harness check`: resolved config, notes, violations and exit codes."""

from __future__ import annotations

import json

from harness.cli import main
from miles_async_core.rules import PROFILES

# the upstream profile, named after the pinned Miles commit
UPSTREAM = next(name for name in PROFILES if name.startswith("miles-"))


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["check", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_fully_async_with_abort_fails_naming_both_flags(capsys):
    rc, out, _ = run(capsys, "--", "--fully-async", "--pause-generation-mode", "abort")
    assert rc == 2
    line = next(x for x in out.splitlines() if x.startswith("[manual-fully-async-no-abort]"))
    assert "--fully-async" in line and "--pause-generation-mode" in line


def test_colocated_fully_async_passes_manual_and_fails_upstream(capsys):
    argv = ["--", "train_async.py", "--fully-async", "--colocate", "--pause-generation-mode", "retract"]
    rc, out, _ = run(capsys, *argv)
    assert rc == 0 and "# OK: 0 error(s)" in out
    rc, out, _ = run(capsys, "--profile", UPSTREAM, *argv)
    assert rc == 2
    assert "[miles-colocate-not-async]" in out and "Colocation is not supported for async training." in out


def test_one_step_colocate_fails_both_profiles(capsys):
    for profile in ("manual", UPSTREAM):
        rc, out, _ = run(capsys, "--profile", profile, "--", "train_async.py", "--colocate")
        assert rc == 2, profile
        assert "--colocate" in out


def test_resolved_values_and_ignored_flags_are_printed(capsys):
    rc, out, _ = run(
        capsys,
        "--",
        "python",
        "train_async.py",
        "--fully-async",
        "--rollout-batch-size",
        "4",
        "--n-samples-per-prompt",
        "2",
        "--async-max-concurrent-samples",
        "6",
        "--lr",
        "1e-6",
    )
    assert rc == 0
    lines = set(out.splitlines())
    assert {
        "rollout_batch_size = 4",
        "capacity = 8",
        "group_budget = 3",
        "over_sampling_batch_size = 4",
        "rollout_submission_granularity = sample",
        "driver = train_async",
        "note: ignored, not modelled by the harness: --lr 1e-6",
    } <= lines


def test_a_note_does_not_fail_the_check(capsys):
    rc, out, _ = run(capsys, "--", "--fully-async", "--over-sampling-batch-size", "16")
    assert rc == 0
    assert "[manual-fully-async-over-sampling-no-effect] note:" in out
    assert "# OK: 0 error(s), 1 note(s)" in out


def test_a_parse_error_exits_2_with_the_message_and_no_traceback(capsys):
    rc, out, err = run(capsys, "--", "--rollout-batch-size", "abc")
    assert rc == 2 and out == ""
    assert "--rollout-batch-size 'abc'" in err and "Traceback" not in err


def test_an_unknown_profile_exits_2_naming_the_choices(capsys):
    rc, _, err = run(capsys, "--profile", "upstream", "--", "--fully-async")
    assert rc == 2
    assert "--profile 'upstream'" in err and UPSTREAM in err


def test_an_undefined_group_budget_is_printed_not_raised(capsys):
    rc, out, _ = run(capsys, "--", "--n-samples-per-prompt", "0", "--async-max-concurrent-samples", "4")
    assert rc == 2
    assert "group_budget = undefined" in out and "[n-samples-per-prompt-positive]" in out


def test_json_output_is_one_document_with_config_and_violations(capsys):
    rc, out, _ = run(
        capsys, "--json", "--profile", UPSTREAM, "--", "--fully-async", "--update-weights-interval", "0", "--seed", "3"
    )
    assert rc == 2
    doc = json.loads(out)
    assert doc["ok"] is False and doc["profile"] == UPSTREAM
    assert doc["config"]["seed"] == 3 and doc["resolved"]["capacity"] == 16
    assert [v["rule_id"] for v in doc["violations"]] == ["update-weights-interval-positive"]


def test_an_empty_command_line_is_the_valid_default(capsys):
    rc, out, _ = run(capsys, "--")
    assert rc == 0 and "rollout_batch_size = 8" in out


def test_a_miles_flag_before_the_separator_is_a_usage_error_showing_the_command_with_it(capsys):
    rc, out, err = run(capsys, "--json", "--fully-async", "--pause-generation-mode", "abort")
    assert rc == 2 and out == ""
    first = err.splitlines()[0]
    assert "--fully-async is a Miles flag" in first
    assert first.endswith("Fix: miles-harness check --json -- --fully-async --pause-generation-mode abort")


def test_a_misspelled_miles_flag_is_an_error_naming_the_nearest_flag(capsys):
    rc, out, err = run(capsys, "--", "--fully-async", "--update-weight-interval", "2")
    assert rc == 2 and out == ""
    first = err.splitlines()[0]
    assert (
        "unknown Miles flag --update-weight-interval" in first
        and "nearest known flag is --update-weights-interval" in first
    )
    assert "--allow-unknown-miles-flags" in first


def test_the_opt_out_turns_an_unknown_miles_flag_into_a_note(capsys):
    rc, out, _ = run(capsys, "--allow-unknown-miles-flags", "--", "--fully-async", "--flag-of-a-newer-miles", "3")
    assert rc == 0
    assert "note: ignored, not modelled by the harness: --flag-of-a-newer-miles 3" in out.splitlines()


def test_flags_of_miles_megatron_and_sglang_that_are_not_modelled_are_notes(capsys):
    rc, out, _ = run(capsys, "--", "--hf-checkpoint", "/m", "--lr", "1e-6", "--sglang-mem-fraction-static", "0.8")
    assert rc == 0
    assert "note: ignored, not modelled by the harness: --lr 1e-6" in out.splitlines()


def test_an_option_after_the_separator_belongs_to_the_miles_command_line(capsys):
    rc, out, _ = run(capsys, "--", "--fully-async", "--json")
    assert rc == 2  # --json after -- is a Miles word: no flag of Miles, so an error
    rc, out, _ = run(capsys, "--json", "--", "--fully-async")
    assert rc == 0 and json.loads(out)["config"]["fully_async"] is True


def test_colocated_fully_async_passes_the_manual_but_names_the_extension_a_run_needs(capsys):
    rc, out, _ = run(capsys, "--", "--fully-async", "--colocate")
    assert rc == 0
    assert any(
        line.startswith("note: to run this in the harness") and "--allow-async-colocate" in line
        for line in out.splitlines()
    )


def test_resume_sweep_refuses_a_miles_tree_it_would_ignore_and_names_its_host(capsys, monkeypatch):
    from harness.cli import main as cli
    import harness.lives.sweep as resume_sweep

    assert cli(["resume-sweep", "--miles-src", "/no/such/tree"]) == 2
    first = capsys.readouterr().err.splitlines()[0]
    assert "--miles-src /no/such/tree with --host core" in first and "--host upstream" in first
    monkeypatch.setattr(resume_sweep, "sweep", lambda todo, host: [])
    assert cli(["resume-sweep", "--fast"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "hosts: core (the core's drivers)"


def test_compare_names_a_trace_it_was_given_instead_of_a_results_file(capsys, tmp_path):
    from harness.cli import main as cli

    trace = tmp_path / "t.jsonl"
    trace.write_text('{"kind": "taken", "t": 0}\n{"kind": "trained", "t": 1}\n')
    assert cli(["compare", str(trace), str(trace)]) == 2
    first = capsys.readouterr().err.splitlines()[0]
    assert "is a JSONL trace" in first and "check-trace" in first
