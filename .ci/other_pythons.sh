#!/usr/bin/env bash
# The fast tier's torch-free part (the core, the property suites, the harness' own suite:
# virtual time, checkers, the golden and cross-Python traces, the watchdog) on CPython 3.12
# and 3.13. `make test` covers 3.11 with everything; torch has no CPU wheel for 3.12/3.13
# in this machine's wheel cache, and its CUDA build is a multi-GB download, so the modules
# that import torch (listed below) run on 3.11 only. Each minor's venv is cached in
# .venv-py3NN (gitignored); PY312 / PY313 name another interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
export HYPOTHESIS_PROFILE=miles-harness-ci PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PACKAGES="pytest>=8 hypothesis>=6.100 pytest-timeout>=2.2 numpy>=1.26 pyyaml>=6 nvidia-ml-py>=12.535 matplotlib>=3.8
  check-jsonschema>=0.29 zizmor>=1.0 coverage>=7"
NEEDS_TORCH=(
  suites/properties/test_mutant_zoo.py suites/harness/test_gap_decomposition.py
  suites/harness/test_gap_metrics.py suites/harness/test_kernel_ablation.py
  suites/harness/test_nested_group_checkers.py suites/harness/test_overlap.py
  suites/harness/test_overlap_loss.py suites/harness/test_realrun.py suites/harness/test_run_cli.py
  suites/harness/test_resume.py  # its seeded bugs come from fixtures.mutants, whose engine mutants subclass the torch engine
  # and single tests deselected below
)
ignore=(--deselect suites/harness/test_cpu_use.py::test_run_prints_the_cores_per_mode_with_the_hosts_count_as_a_whole_number)
# `run` imports the torch engine; the main job's host record comes from a run
ignore+=(--deselect "suites/harness/test_cli_inputs.py::test_every_generated_command_line_exits_with_a_documented_code_and_one_clear_first_line[run]")
ignore+=(--deselect suites/harness/test_host_load.py::test_the_main_jobs_record_names_each_run_by_mode_and_repeat)
# the install closure is read from the full install (`make test`'s venv), which this tier does not have
ignore+=(--deselect suites/harness/test_gate_workflow_runs.py::test_the_install_names_every_installed_package_the_miles_trees_import)
for f in "${NEEDS_TORCH[@]}"; do ignore+=(--ignore "$f"); done

find_python() {  # $1 = 3.12: a pyenv build, else python3.12 on PATH (one that runs: not a bare shim)
  local c
  for c in $(ls -d "$HOME"/.pyenv/versions/"$1".*/bin/python 2>/dev/null | sort -rV) "python$1"; do
    if "$c" -c "" >/dev/null 2>&1; then echo "$c"; return; fi
  done
}

setup() {  # $1 = 3.12: make (or reuse) .venv-py312; prints its python
  local minor=$1 var="PY${1/./}" py venv=".venv-py${1/./}"
  py="${!var:-$(find_python "$minor")}"
  if [ -z "$py" ]; then
    echo "other_pythons: no CPython $minor found; fix: install it (pyenv install $minor) or set $var=PATH" >&2
    return 1
  fi
  if [ ! -f "$venv/.installed" ] || [ "$(cat "$venv/.installed")" != "$PACKAGES" ]; then
    "$py" -m venv "$venv" >&2
    "$venv/bin/python" -m pip install -q $PACKAGES >&2
    # the project itself, without its dependencies (torch): its pytest plugin's entry point
    "$venv/bin/python" -m pip install -q --no-deps -e . >&2
    echo "$PACKAGES" > "$venv/.installed"
  fi
}

run_tier() {  # $1 = 3.12
  local venv=".venv-py${1/./}" start=$SECONDS rc=0
  echo "== CPython $("$venv/bin/python" -c 'import platform; print(platform.python_version())'): fast tier, torch-free part"
  "$venv/bin/python" -m pytest -q -p no:cacheprovider -m "not slow and not bench" --durations=5 \
    suites/core suites/properties suites/harness "${ignore[@]}" || rc=$?
  echo "== CPython $1: exit $rc after $((SECONDS - start)) s"
  return $rc
}

# set up one after the other (pip), then the two minors side by side: one core each
for minor in 3.12 3.13; do setup "$minor"; done
logs=$(mktemp -d)
pids=()
for minor in 3.12 3.13; do
  run_tier "$minor" > "$logs/$minor.log" 2>&1 &
  pids+=($!)
done
status=0
for i in 0 1; do
  wait "${pids[$i]}" || status=1
done
cat "$logs/3.12.log" "$logs/3.13.log"
rm -rf "$logs"
exit $status
