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
    assert s == {"min": 1.0, "max": 4.0, "median": 2.5, "mean": 2.5, "stddev": pytest.approx(1.2909944),
                 "q1": 1.75, "q3": 3.25, "n": 4}
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
        f"results file {path} was written by schema_version 7; this harness reads up to 1: "
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
        (lambda d: d["benchmarks"]["wall_s"].update(higher_is_better=1), "benchmarks.wall_s.higher_is_better", "true or false"),
        (lambda d: d["benchmarks"]["wall_s"]["samples"].__setitem__(1, "3"), "benchmarks.wall_s.samples[1]", "finite number"),
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
