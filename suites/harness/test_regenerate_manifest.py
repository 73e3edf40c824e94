"""``make results``' manifest: a step rerun with ``--only`` records its own commit and
machine, and the steps not rerun keep theirs."""

from __future__ import annotations

import json

from harness.results.regenerate import _merge_manifest

AMD = {"cpu_count": 2, "cpu_model": "AMD EPYC", "driver_version": None, "gpus": []}
INTEL = {"cpu_count": 2, "cpu_model": "Intel(R) Xeon(R) Processor", "driver_version": None, "gpus": []}


def _run(commit, machine, *names):
    return {
        "schema_version": 1,
        "started_utc": "t",
        "git": {"commit": commit, "dirty": False},
        "machine": machine,
        "steps": [{"name": n, "argv": [n], "env": {}, "outputs": [f"{n}.json"], "wall_s": 1.0, "rc": 0} for n in names],
    }


def test_a_rerun_step_records_its_machine_and_the_others_keep_theirs(tmp_path):
    path = tmp_path / "MANIFEST.json"
    _merge_manifest(_run("a" * 40, AMD, "sim_speed", "sim_profile"), path)
    _merge_manifest(_run("b" * 40, INTEL, "sim_speed"), path)
    doc = json.loads(path.read_text())
    steps = {s["name"]: s for s in doc["steps"]}
    assert [s["name"] for s in doc["steps"]] == ["sim_profile", "sim_speed"]
    assert steps["sim_profile"]["git"]["commit"] == "a" * 40 and steps["sim_profile"]["machine"] == AMD
    assert steps["sim_speed"]["git"]["commit"] == "b" * 40 and steps["sim_speed"]["machine"] == INTEL
    assert doc["machine"] == INTEL and doc["git"]["commit"] == "b" * 40  # the latest run's


def test_a_step_kept_from_before_steps_had_a_machine_gets_none_invented(tmp_path):
    path = tmp_path / "MANIFEST.json"
    old = _run("a" * 40, AMD)
    old["steps"] = [
        {
            "name": "ray_layout",
            "argv": ["x"],
            "env": {},
            "outputs": ["r.json"],
            "wall_s": 1.0,
            "rc": 0,
            "git": {"commit": "c" * 40, "dirty": False},
        }
    ]
    path.write_text(json.dumps(old))
    _merge_manifest(_run("b" * 40, INTEL, "sim_speed"), path)
    steps = {s["name"]: s for s in json.loads(path.read_text())["steps"]}
    assert "machine" not in steps["ray_layout"] and steps["ray_layout"]["git"]["commit"] == "c" * 40
    assert steps["sim_speed"]["machine"] == INTEL
