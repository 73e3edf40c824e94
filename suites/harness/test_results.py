"""Results files: write/load round trip, field-by-field validation errors, and the
pytest-benchmark conversion checked against real pytest-benchmark 5.3.1 output."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness.results.schema import (
    SCHEMA,
    SCHEMA_VERSION,
    Results,
    from_pytest_benchmark,
    load_any,
    load_results,
    summarize,
)
from miles_async_core.errors import ConfigError

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "results"


def _results() -> Results:
    res = Results.new("run", {"rollout_batch_size": 8, "mode": "fully_async"}, definition_common={"model": "tiny"})
    rng = np.random.default_rng(0)
    res.add_benchmark("tokens_per_s", rng.normal(1000.0, 20.0, 12), "tokens/s", True, {"window": "steady"})
    res.add_benchmark("wall_s", [3.0, 3.5, 2.5], "s", False)
    return res


def test_written_file_loads_back_identical_with_sorted_keys(tmp_path):
    res = _results()
    path = res.write(tmp_path / "deep" / "dir" / "results.json")
    text = path.read_text()
    assert text.startswith('{\n "benchmarks"')  # sorted keys, indent 1
    loaded = load_results(path)
    assert loaded.to_dict() == res.to_dict()
    assert loaded.doc["schema"] == SCHEMA and loaded.doc["schema_version"] == SCHEMA_VERSION


def test_document_records_machine_software_git_and_merged_definition():
    doc = _results().to_dict()
    assert doc["kind"] == "run" and doc["config"]["rollout_batch_size"] == 8
    assert doc["created_utc"].endswith("Z")
    assert isinstance(doc["machine"]["cpu_count"], int) and isinstance(doc["machine"]["gpus"], list)
    assert "hostname" not in json.dumps(doc["machine"]) and "node" not in doc["machine"]
    assert doc["software"]["numpy"] == np.__version__
    assert doc["git"] is None or isinstance(doc["git"]["dirty"], bool)
    tok = doc["benchmarks"]["tokens_per_s"]
    assert tok["definition"] == {"model": "tiny", "window": "steady"}
    assert len(tok["samples"]) == 12 and tok["stats"]["n"] == 12


def test_summary_stats_match_hand_computed_values():
    s = summarize([1.0, 2.0, 3.0, 4.0])
    assert s == {
        "min": 1.0,
        "max": 4.0,
        "median": 2.5,
        "mean": 2.5,
        "stddev": pytest.approx(1.2909944),
        "q1": 1.75,
        "q3": 3.25,
        "n": 4,
    }
    assert summarize([5.0])["stddev"] == 0.0


@pytest.mark.parametrize(
    ("samples", "needle"),
    [([], "samples is empty"), ([1.0, float("nan")], "non-finite"), (["x"], "sequence of numbers")],
)
def test_bad_samples_are_refused_with_the_benchmark_name(samples, needle):
    res = Results.new("run", {})
    with pytest.raises(ConfigError, match=needle) as err:
        res.add_benchmark("tokens_per_s", samples, "tokens/s", True)
    assert "tokens_per_s" in str(err.value)


def test_damaged_json_names_the_file_and_the_position(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(_results().to_dict())[:200])
    with pytest.raises(ConfigError) as err:
        load_results(path)
    msg = str(err.value)
    assert str(path) in msg and "not valid JSON" in msg and "line 1 column" in msg and "char" in msg


def test_future_schema_version_asks_for_an_upgrade(tmp_path):
    doc = _results().to_dict()
    doc["schema_version"] = 7
    path = tmp_path / "future.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as err:
        load_results(path)
    assert str(err.value) == (
        f"results file {path} was written by schema_version 7; this harness reads up to {SCHEMA_VERSION}: "
        "upgrade miles-async-harness."
    )


def _mutated(mutate) -> dict:
    doc = _results().to_dict()
    mutate(doc)
    return doc


@pytest.mark.parametrize(
    ("mutate", "field", "needle"),
    [
        (lambda d: d.pop("run_id"), "run_id", "is missing"),
        (lambda d: d.update(schema="other/thing"), "schema", "expected 'miles-async-harness/results'"),
        (lambda d: d.update(schema_version="1"), "schema_version", "expected an integer"),
        (lambda d: d.update(config=[1]), "config", "is array"),
        (lambda d: d.update(created_utc="yesterday"), "created_utc", "ISO 8601"),
        (lambda d: d["machine"].pop("cpu_model"), "machine.cpu_model", "is missing"),
        (
            lambda d: d["benchmarks"]["wall_s"].update(higher_is_better=1),
            "benchmarks.wall_s.higher_is_better",
            "true or false",
        ),
        (
            lambda d: d["benchmarks"]["wall_s"]["samples"].__setitem__(1, "3"),
            "benchmarks.wall_s.samples[1]",
            "finite number",
        ),
        (lambda d: d["benchmarks"]["wall_s"]["stats"].pop("q3"), "benchmarks.wall_s.stats.q3", "is missing"),
        (lambda d: d["benchmarks"]["wall_s"].update(samples=[]), "benchmarks.wall_s.samples", "is empty"),
    ],
)
def test_each_malformed_field_is_named_with_the_file(tmp_path, mutate, field, needle):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_mutated(mutate)))
    with pytest.raises(ConfigError) as err:
        load_results(path)
    msg = str(err.value)
    assert str(path) in msg and f"'{field}'" in msg and needle in msg


def test_pytest_benchmark_file_with_data_keeps_every_raw_sample():
    raw = json.loads((FIXTURES / "pytest_benchmark_5.3.1_data.json").read_text())
    res = from_pytest_benchmark(FIXTURES / "pytest_benchmark_5.3.1_data.json")
    assert res.kind == "pytest-benchmark"
    assert sorted(res.benchmarks) == sorted(b["fullname"] for b in raw["benchmarks"])
    for b in raw["benchmarks"]:
        entry = res.benchmarks[b["fullname"]]
        assert entry["samples"] == b["stats"]["data"] and "samples_missing" not in entry
        assert entry["unit"] == "s" and entry["higher_is_better"] is False
        assert entry["stats"]["median"] == pytest.approx(b["stats"]["median"])
        assert entry["definition"]["params"] == b["params"]
        assert res.extra["pytest_benchmark"][b["fullname"]]["extra_info"] == b["extra_info"]
    assert res.machine["cpu_model"] == raw["machine_info"]["cpu"]["brand_raw"]
    assert res.created_utc.endswith("Z") and res.doc["git"] == {"commit": None, "dirty": False}


def test_pytest_benchmark_file_without_data_keeps_stats_and_invents_no_samples():
    raw = json.loads((FIXTURES / "pytest_benchmark_5.3.1_nodata.json").read_text())
    res = from_pytest_benchmark(raw)
    for b in raw["benchmarks"]:
        entry = res.benchmarks[b["fullname"]]
        assert entry["samples"] == [] and entry["samples_missing"] is True
        assert entry["stats"]["median"] == b["stats"]["median"] and entry["stats"]["n"] == b["stats"]["rounds"]


def test_converted_pytest_benchmark_round_trips_through_a_results_file(tmp_path):
    for name in ("pytest_benchmark_5.3.1_data.json", "pytest_benchmark_5.3.1_nodata.json"):
        res = from_pytest_benchmark(FIXTURES / name)
        assert from_pytest_benchmark(FIXTURES / name).run_id == res.run_id  # deterministic
        path = res.write(tmp_path / name)
        assert load_results(path).to_dict() == res.to_dict()
        assert load_any(FIXTURES / name).to_dict() == res.to_dict()


def test_strict_loader_points_pytest_benchmark_files_to_the_converter():
    with pytest.raises(ConfigError, match="looks like pytest-benchmark output"):
        load_results(FIXTURES / "pytest_benchmark_5.3.1_data.json")


# --- a run's mode table: typed rows, keyed by mode name, both layouts ------------------------


def _run_doc(table):
    row = {
        "mode": "one-step",
        "steps": 40,
        "wall_s": 12.5,
        "speedup": 1.69,
        "overlap_efficiency": 0.95,
        "overlap_efficiency_min": 0.92,
        "overlap_efficiency_max": 0.97,
        "age_hist": {"0": 3, "1": 37},
        "lag_hist": {},
        "error": None,
        "worker_error": None,
        "repeats": 2,
    }
    sync = {
        "mode": "sync",
        "steps": 40,
        "wall_s": 21.0,
        "age_hist": {"0": 40},
        "lag_hist": {},
        "error": None,
        "worker_error": None,
        "repeats": 2,
    }
    rows = [sync, row]
    return {
        "kind": "run",
        "schema_version": 1 if table == "list" else 2,
        "extra": {
            "table": rows if table == "list" else {r["mode"]: r for r in rows},
            "repeats": {"one-step": [dict(row, repeats=None, checks={"passed": True})]},
        },
    }


@pytest.mark.parametrize("layout", ["list", "keyed"])
def test_a_run_table_loads_into_typed_rows_keyed_by_mode_in_either_layout(layout):
    from harness.results.mode_rows import ModeRow, repeats_of, table_of

    table = table_of(_run_doc(layout))
    assert list(table) == ["sync", "one-step"]
    one = table["one-step"]
    assert isinstance(one, ModeRow) and one.overlap_efficiency == 0.95 and one.overlap_efficiency_min == 0.92
    assert one.age_hist == {0: 3, 1: 37} and table["sync"].speedup is None
    assert repeats_of(_run_doc(layout))["one-step"][0].checks == {"passed": True}


def test_upgrading_the_old_layout_keys_the_table_by_mode_and_changes_no_value(tmp_path):
    from harness.results.mode_rows import upgrade_file

    old = _run_doc("list")
    path = tmp_path / "results.json"
    path.write_text(json.dumps(old))
    assert upgrade_file(path) is True
    new = json.loads(path.read_text())
    assert new["schema_version"] == 2 and new["extra"]["table"] == {r["mode"]: r for r in old["extra"]["table"]}
    assert new["extra"]["repeats"] == old["extra"]["repeats"]
    assert upgrade_file(path) is False  # already in the new layout: left as it is


def test_a_typed_row_written_and_read_back_is_the_same_row():
    from harness.results.mode_rows import ModeRow

    row = ModeRow(mode="fully-async", steps=40, wall_s=14.0, speedup=1.5, age_hist={0: 1, 4: 2}, losses={"gap_s": 1})
    assert ModeRow.from_dict(json.loads(json.dumps(row.to_dict()))) == row


def test_a_row_with_an_unknown_key_names_the_key_and_where():
    from harness.results.mode_rows import table_of

    doc = _run_doc("keyed")
    doc["extra"]["table"]["one-step"]["speedup_typo"] = 1.0
    with pytest.raises(ConfigError, match=r"f\.json: extra\.table\.one-step: unknown key 'speedup_typo'"):
        table_of(doc, "f.json")


def test_a_file_of_another_kind_has_no_mode_table():
    from harness.results.mode_rows import table_of

    with pytest.raises(ConfigError, match="g.json: kind 'gap' has no mode table"):
        table_of({"kind": "gap", "extra": {"table": [{"factor": "dtype"}]}}, "g.json")


def _committed_run_files() -> list[Path]:
    root = Path(__file__).resolve().parents[2]
    found = []
    for path in sorted([*root.glob("results/**/*.json"), *root.glob("fixtures/**/*.json")]):
        try:
            doc = json.loads(path.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError):
            continue
        if isinstance(doc, dict) and doc.get("schema") == "miles-async-harness/results" and doc.get("kind") == "run":
            found.append(path)
    return found


def test_every_committed_run_results_file_loads_through_the_typed_extras():
    from harness.results.run_extras import RunExtras

    files = _committed_run_files()
    assert files, "the repository holds run results files (results/cpu, results/advise)"
    for path in files:
        doc = load_results(path).doc
        extras = RunExtras.from_doc(doc, str(path))
        assert set(extras.table) == set(extras.modes) and extras.table, path
        for mode, row in extras.table.items():
            assert row.mode == mode and extras.modes[mode].phases, (path, mode)
            assert len(extras.repeats[mode]) == row.repeats, (path, mode)
        # what the main job writes reads back as the same extras
        assert RunExtras.from_doc({"kind": "run", "extra": extras.to_dict()}) == extras, path


def test_run_extras_read_a_list_table_and_refuse_another_kind_naming_the_file():
    from harness.results.run_extras import RunExtras

    old = {"kind": "run", "extra": {"table": [{"mode": "sync", "steps": 2}], "modes": {"sync": {"phases": []}}}}
    extras = RunExtras.from_doc(old, "old.json")
    assert extras.table["sync"].steps == 2 and extras.per_step == {} and extras.engines is None
    with pytest.raises(ConfigError, match="gap.json.*kind 'gap'"):
        RunExtras.from_doc({"kind": "gap", "extra": {}}, "gap.json")
    with pytest.raises(ConfigError, match=r"bad.json: extra.modes.sync.wall_s is 'fast'; expected a number"):
        RunExtras.from_doc({"kind": "run", "extra": {"modes": {"sync": {"wall_s": "fast"}}}}, "bad.json")


def test_the_summary_reads_a_run_file_by_mode_and_the_gpu_scripts_outdir(tmp_path, capsys):
    import shutil

    from harness.results.summary import main as summary

    run = next(p for p in _committed_run_files() if p.parent.name == "run-a")
    assert summary([str(run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{run}: kind run")
    assert [line.split()[0] for line in lines[1:]] == ["fully-async", "one-step", "sync"]
    assert "speedup" in lines[2] and "speedup" not in lines[3]
    shutil.copy(run, tmp_path / "run.json")
    assert summary(["--gpu-checks", str(tmp_path), "--run-rc", "0", "--gap-rc", "124"]) == 0
    text = capsys.readouterr().out
    assert "(a) miles-harness run: ok; run.json present" in text and "(b) miles-harness gap: timed out" in text
    assert "      one-step     steps" in text and "(c) telemetry: MISSING" in text
    doc = json.loads(run.read_text())
    doc["extra"]["table"]["sync"]["wall_s"] = "slow"
    (tmp_path / "run.json").write_text(json.dumps(doc))
    assert summary(["--gpu-checks", str(tmp_path)]) == 2
    assert "extra.table.sync" in capsys.readouterr().err
