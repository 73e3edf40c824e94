"""Every command line a user can type gets a documented exit code, one clear first line and
no traceback.

A Hypothesis property drives each subcommand in-process (``harness.cli.main``) with
generated argument lists: the command's own options in any order, values (numbers out of
range, odd text), Miles flags before and after ``--`` (modelled, known to Miles, misspelled),
and paths to small generated files (empty, JSON, JSONL, TOML, text, a folder, a missing
path). What would start long work is stubbed at its leaf, after every check the command
makes (the stub records that it was reached): the training loop of ``run``, the ablation of
``gap``, the server of ``serve``, the sweep of ``resume-sweep``, the cases of
``diff-upstream`` and ``gate``, importing an upstream tree (``source.activate``); ``simulate`` and ``advise`` run for real on at most two
steps. ``MILES_SRC`` is unset and ``--miles-src`` only ever names a generated path, so no
upstream tree is run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import itertools
import json
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import cli

EXAMPLES = 30
MILES_WORDS = (
    "--fully-async",
    "--colocate",
    "--allow-async-colocate",
    "--rollout-batch-size",
    "--update-weights-interval",
    "--update-weight-interval",
    "--num-rollout",
    "--pause-generation-mode",
    "--lr",
    "--sglang-mem-fraction-static",
    "--no-such-miles-flag",
    "train_async.py",
    "train.py",
)
VALUES = ("0", "-3", "1", "2", "99999", "1e9", "nan", "abc", "", "retract", "abort", "-", "x=y", "fp32,bf16", "cpu")
FILE_KINDS = ("missing", "empty", "json", "jsonl", "toml", "text", "dir")
ERROR_LINE = re.compile(r"^miles-harness( [a-z-]+)?: (error: .+|interrupted)$")


def _write(root: Path, kind: str, body: str, n: int) -> str:
    path = root / f"f{n}.{ {'jsonl': 'jsonl', 'toml': 'toml', 'json': 'json'}.get(kind, 'txt') }"
    if kind == "missing":
        return str(root / f"missing{n}" / "x.json")
    if kind == "dir":
        path = root / f"d{n}"
        path.mkdir()
        (path / "x.jsonl").write_text(body)
        return str(path)
    text = {
        "empty": "",
        "json": json.dumps({"kind": body, "schema_version": 1, "benchmarks": [body]}),
        "jsonl": "\n".join(json.dumps({"kind": body, "t": i}) for i in range(3)) + "\n" + body,
        "toml": f'name = "{body}"\n[config]\nrollout_batch_size = 2\n',
        "text": body,
    }[kind]
    path.write_text(text)
    return str(path)


def _words(command: str, root: Path):
    options = sorted(o for o in cli.command_parser(command)._option_string_actions if o not in ("-h", "--help"))
    counter = itertools.count()
    files = st.builds(
        lambda kind, body: _write(root, kind, body, next(counter)),
        st.sampled_from(FILE_KINDS),
        st.text(alphabet='ab{}[]":,0 \n', max_size=12),
    )
    head = st.one_of(
        st.sampled_from(options),
        st.sampled_from(VALUES),
        files,
        st.sampled_from(MILES_WORDS),
        st.text(alphabet="-abz=9 ", max_size=6),
    )
    tail = st.one_of(st.sampled_from(MILES_WORDS), st.sampled_from(VALUES))
    return st.tuples(
        st.lists(head, max_size=6),
        st.one_of(st.none(), st.lists(tail, max_size=4)),
    ).map(lambda ht: [command, *ht[0], *([] if ht[1] is None else ["--", *ht[1]])])


@pytest.fixture
def leaves(monkeypatch):
    """Stub what would start long work, at the leaf; returns the names of the leaves reached."""
    reached: list[str] = []
    monkeypatch.delenv("MILES_SRC", raising=False)

    def stub(name: str, result):
        def leaf(*_a, **_k):
            reached.append(name)
            print(f"{name}: stubbed")
            return result() if callable(result) else result

        return leaf

    import harness.commands.diff_upstream as diff_upstream
    import harness.commands.gap as gap
    import harness.commands.run as run
    import harness.commands.serve as serve
    import harness.lives.sweep as resume_sweep
    import harness.upstream.gate_trees as gate_trees
    import harness.upstream.source as source

    monkeypatch.setattr(run, "_run_repeats", stub("run", ({}, {})))
    monkeypatch.setattr(run, "_finish", lambda *a, **k: 0)
    monkeypatch.setattr(gap, "_run", stub("gap", 0))
    monkeypatch.setattr(serve, "_serve", stub("serve", 0))
    monkeypatch.setattr(resume_sweep, "sweep", stub("resume-sweep", list))
    monkeypatch.setattr(diff_upstream, "_run_cases", stub("diff-upstream", 0))
    monkeypatch.setattr(source, "activate", stub("activate an upstream tree", None))
    monkeypatch.setattr(
        gate_trees, "run_trees", stub("gate", lambda: {"head": {"refused": "stubbed"}, "base": {"refused": "stubbed"}})
    )
    _cap_steps(monkeypatch)
    return reached


def _cap_steps(monkeypatch) -> None:
    """simulate and advise run for real, on at most two steps."""
    import harness.advise.predict as predict
    import harness.commands.simulate as simulate

    def short(config):
        return dataclasses.replace(config, num_rollout=min(config.num_rollout, config.start_rollout_id + 2))

    real_simulate = simulate.simulate
    monkeypatch.setattr(
        simulate, "simulate", lambda sc, *a, **k: real_simulate(dataclasses.replace(sc, config=short(sc.config)))
    )
    for name in ("predict", "recommend", "sweep_engines"):
        real = getattr(predict, name)
        monkeypatch.setattr(
            predict, name, lambda costs, config, *a, _real=real, **k: _real(costs, short(config), *a, **k)
        )
    monkeypatch.setattr(predict, "engine_counts", lambda engines: [engines])
    monkeypatch.setattr(predict, "plot_sweep", lambda rows, path, title: path)


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_every_generated_command_line_exits_with_a_documented_code_and_one_clear_first_line(
    command, leaves, monkeypatch, capsys
):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        monkeypatch.chdir(root)  # outputs a command writes by default land here
        driven: list[list[str]] = []

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        )
        @given(argv=_words(command, root))
        def drive(argv: list[str]) -> None:
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    rc = cli.main(argv)
                except BaseException as exc:  # noqa: BLE001 - any escape is what this test looks for
                    pytest.fail(f"{argv}: {type(exc).__name__} escaped main: {exc}")
            driven.append(argv)
            text = out.getvalue() + err.getvalue()
            assert rc in cli.EXIT_CODES, (argv, rc, text[-400:])
            assert "Traceback" not in text, (argv, text[-2000:])
            if rc == 2 and not (command == "check" and not err.getvalue()):  # check's verdict: a report on stdout
                first = err.getvalue().splitlines()[0] if err.getvalue() else ""
                assert ERROR_LINE.match(first), (argv, first, text[-400:])
            else:
                first = next((line for line in text.splitlines() if line.strip()), "")
                assert first.strip(), (argv, rc, "no output")

        drive()
        capsys.readouterr()
        print(f"{command}: {len(driven)} generated command lines, 0 tracebacks, leaves reached {len(leaves)}")
        assert len(driven) >= EXAMPLES // 2
