#!/usr/bin/env bash
# GPU benchmark checks in one script: torch only, no network, no sglang, < 8 minutes.
#
#   [DEVICE=cuda|cpu] [PY=python] [GAP_MODEL=tiny|smollm2|PATH] [RUN_STEPS=20] \
#     bash suites/gpu/run_gpu_checks.sh OUTDIR
#
# (a) the main job on the real engine and trainer (`miles-harness run`), 20 steps per
#     mode; `--device $DEVICE` is passed only when `miles-harness run --help` lists it;
#     its results.json is copied to OUTDIR/run.json for the CI comparison;
# (b) the kernel-level gap table (`miles-harness gap`) in fp32, bf16 and fp16 on $DEVICE,
#     with per-row GPU telemetry in OUTDIR/gap/telemetry.json;
# (c) GPU telemetry (harness.measure.telemetry.TelemetrySampler, NVML) over both, tagged with
#     the stage, in OUTDIR/telemetry.json;
# (d) with DEVICE=cuda and sglang installed: the SGLang conformance suite
#     (suites/sglang_conformance) against a real SGLang server launched here on
#     $MILES_SGLANG_TEST_MODEL (default: SmolLM2-135M-Instruct exported from the packaged GGUF),
#     output in OUTDIR/conformance.txt; skipped, and said so, otherwise;
# (e) with MILES_CMD set: a real Miles run with the recorder (harness.record), merged and
#     checked; see the stage below. DEVICE=cpu without MILES_CMD runs upstream Miles on the
#     CPU (`python -m harness.record.served_run`: its train_async.py loop behind CPU servers)
#     when an upstream tree is found ($MILES_SRC or the pinned tree beside the repository).
# DEVICE=cpu is a dry run with tiny settings (about a minute); suites/gpu/test_dry_run.py runs it.
# The summary reads every results file through the schema (python -m harness.results.summary).
# Exit status: 0 when every stage passed, 1 otherwise (the summary says which).
set -euo pipefail

OUT=${1:?usage: [DEVICE=cuda|cpu] bash suites/gpu/run_gpu_checks.sh OUTDIR}
DEVICE=${DEVICE:-cuda}
GAP_MODEL=${GAP_MODEL:-tiny}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
if [[ -z "${PY:-}" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
fi
cd "$ROOT"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
HARNESS=("$PY" -m harness.cli)
log() { echo "[gpu-checks $(date -u +%H:%M:%S)] $*"; }

case "$DEVICE" in
  cuda)
    RUN_ARGS=(--steps "${RUN_STEPS:-20}")
    GAP_ARGS=(--num-seqs 32 --max-new-tokens 64)
    RUN_LIMIT_S=300; GAP_LIMIT_S=150 ;;
  cpu)
    RUN_ARGS=(--steps 2 --modes sync,one-step --d-model 32 --layers 1 -- --rollout-batch-size 4
              --n-samples-per-prompt 2)
    GAP_ARGS=(--num-seqs 4 --max-new-tokens 8 --d-model 32 --layers 1 --threads 1)
    RUN_LIMIT_S=240; GAP_LIMIT_S=120 ;;
  *) echo "DEVICE=$DEVICE: allowed cuda or cpu; fix: DEVICE=cpu for a dry run" >&2; exit 2 ;;
esac

log "device $DEVICE, output $OUT, python $PY"
"$PY" - "$DEVICE" <<'EOF'
import sys, torch
print(f"torch {torch.__version__}, cuda available: {torch.cuda.is_available()}"
      + (f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""))
if sys.argv[1] == "cuda" and not torch.cuda.is_available():
    sys.exit("DEVICE=cuda but torch sees no CUDA device; fix: install a CUDA torch or run with DEVICE=cpu")
EOF

# (c) telemetry over the whole script; the stage name is read from OUT/.phase.
echo setup > "$OUT/.phase"
"$PY" - "$OUT/telemetry.json" "$OUT/.phase" <<'EOF' &
import json, signal, sys, threading
from harness.measure.telemetry import TelemetrySampler
path, phase_file = sys.argv[1], sys.argv[2]
def phase():
    with open(phase_file, encoding="utf-8") as fh:
        return fh.read().strip()
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
sampler = TelemetrySampler(interval_s=0.2, phase_fn=phase).start()
stop.wait()
sampler.stop()
with open(path, "w", encoding="utf-8") as fh:
    json.dump({"summary": sampler.summary(), "records": sampler.records}, fh, indent=1)
EOF
TELEMETRY_PID=$!
stop_telemetry() {
  if [[ -n "${TELEMETRY_PID:-}" ]]; then
    kill -TERM "$TELEMETRY_PID" 2>/dev/null || true
    wait "$TELEMETRY_PID" 2>/dev/null || true
    TELEMETRY_PID=
  fi
}
trap stop_telemetry EXIT

# (a) the main job on the real engine and trainer.
DEVICE_FLAG=()
if "${HARNESS[@]}" run --help | grep -q -- '--device'; then
  DEVICE_FLAG=(--device "$DEVICE")
else
  log "note: 'miles-harness run' has no --device flag yet: the real-engine run stays on the CPU"
fi
PLOT_FLAG=()
"$PY" -c "import matplotlib" 2>/dev/null || PLOT_FLAG=(--no-plots)
echo run > "$OUT/.phase"
log "(a) miles-harness run ${DEVICE_FLAG[*]} ${PLOT_FLAG[*]} --out $OUT/run ${RUN_ARGS[*]}"
run_rc=0
timeout "$RUN_LIMIT_S" "${HARNESS[@]}" run "${DEVICE_FLAG[@]}" "${PLOT_FLAG[@]}" --out "$OUT/run" "${RUN_ARGS[@]}" \
  || run_rc=$?
if [[ -f "$OUT/run/results.json" ]]; then
  cp "$OUT/run/results.json" "$OUT/run.json"
  log "copied the main job's results to $OUT/run.json"
else
  log "the main job wrote no results.json"
  if (( run_rc == 0 )); then run_rc=1; fi
fi

# (b) the kernel-level gap table.
echo gap > "$OUT/.phase"
log "(b) miles-harness gap --model $GAP_MODEL --device $DEVICE --dtypes fp32,bf16,fp16 --out $OUT/gap --telemetry ${GAP_ARGS[*]}"
gap_rc=0
timeout "$GAP_LIMIT_S" "${HARNESS[@]}" gap --model "$GAP_MODEL" --device "$DEVICE" --dtypes fp32,bf16,fp16 --out "$OUT/gap" --telemetry \
  "${GAP_ARGS[@]}" || gap_rc=$?

# (d) the SGLang conformance suite against a real SGLang server.
conf_rc=skipped
SGLANG_PID=
stop_sglang() { if [[ -n "${SGLANG_PID:-}" ]]; then kill "$SGLANG_PID" 2>/dev/null || true; wait "$SGLANG_PID" 2>/dev/null || true; SGLANG_PID=; fi; }
trap 'stop_sglang; stop_telemetry' EXIT
if [[ "$DEVICE" == cuda ]] && "$PY" -c "import sglang" 2>/dev/null; then
  echo conformance > "$OUT/.phase"
  MODEL_DIR=${MILES_SGLANG_TEST_MODEL:-$OUT/smollm2-135m}
  [[ -n "${MILES_SGLANG_TEST_MODEL:-}" ]] || "$PY" -c "import sys; from harness.backends.torch_models import load_smollm2, load_smollm2_tokenizer as t; load_smollm2(dtype='bfloat16').hf.save_pretrained(sys.argv[1]); t().save_pretrained(sys.argv[1])" "$MODEL_DIR"
  PORT=${SGLANG_CONFORMANCE_PORT:-30123}
  log "(d) sglang.launch_server --model-path $MODEL_DIR --port $PORT, then pytest suites/sglang_conformance --server-url"
  "$PY" -m sglang.launch_server --model-path "$MODEL_DIR" --host 127.0.0.1 --port "$PORT" --mem-fraction-static 0.3 \
    --random-seed 0 --log-level warning > "$OUT/sglang_server.log" 2>&1 &
  SGLANG_PID=$!
  conf_rc=0
  "$PY" -c "import sys, time, urllib.request as u
end = time.time() + 300
while time.time() < end:
    try: u.urlopen(sys.argv[1] + '/health', timeout=5); sys.exit(0)
    except Exception: time.sleep(2)
sys.exit('the SGLang server did not answer /health within 300 s; see sglang_server.log')" "http://127.0.0.1:$PORT" || conf_rc=$?
  if [[ $conf_rc == 0 ]]; then
    timeout 300 "$PY" -m pytest -q -p no:cacheprovider suites/sglang_conformance --server-url "http://127.0.0.1:$PORT" \
      > "$OUT/conformance.txt" 2>&1 || conf_rc=$?
    tail -n 5 "$OUT/conformance.txt"
  fi
  stop_sglang
else
  log "(d) skipped: needs DEVICE=cuda and sglang (pip install -e '.[gpu]')"
fi

# (e) the recorder against a real Miles run (docs/record.md), only when MILES_CMD holds a
#     Miles command line running train_async.py against SGLang on this device: the
#     recorder's flags are added, MILES_RECORD_EXTRA_FLAGS adds the mode's own (the
#     buffer's with --fully-async, the rollout function's without), and the record in
#     OUTDIR/record is merged and checked (`check-trace --merge`). Skipped, and said so, otherwise.
record_rc=0
if [[ -z "${MILES_CMD:-}" && "$DEVICE" == cpu ]] \
    && "$PY" -c "import sys; from harness.upstream.source import find_miles_src; sys.exit(find_miles_src()[0] is None)"; then
  MILES_CMD="$PY -m harness.record.served_run --num-rollout 2 --rollout-batch-size 2 --n-samples-per-prompt 2"
  MILES_RECORD_EXTRA_FLAGS=${MILES_RECORD_EXTRA_FLAGS:---rollout-function-path harness.record.RecordingRolloutFn}
  log "recorder: DEVICE=cpu, MILES_CMD not set: upstream Miles on the CPU servers"
fi
if [[ -n "${MILES_CMD:-}" ]]; then
  log "recorder: $MILES_CMD + harness.record flags -> $OUT/record"
  # shellcheck disable=SC2086  # MILES_CMD and the extra flags are command lines, split on purpose
  MILES_HARNESS_RECORD_DIR="$OUT/record" $MILES_CMD \
    --custom-generate-function-path harness.record.generate \
    --data-source-path harness.record.RecordingDataSource \
    --dynamic-sampling-filter-path harness.record.dynamic_filter \
    --custom-rollout-log-function-path harness.record.log_rollout_data \
    --custom-convert-samples-to-train-data-path harness.record.convert_samples_to_train_data \
    ${MILES_RECORD_EXTRA_FLAGS:-} || record_rc=$?
  if [[ $record_rc -eq 0 ]]; then
    # shellcheck disable=SC2086
    "${HARNESS[@]}" check-trace --merge "$OUT/record" -- $MILES_CMD || record_rc=$?
  fi
  log "recorder: exit $record_rc"
else
  log "recorder: skipped (MILES_CMD is not set)"
fi

echo done > "$OUT/.phase"
stop_telemetry
rm -f "$OUT/.phase"

# Summary: every file read through the results schema (harness.results.summary).
log "summary"
RECORD_RC_FLAG=()
[[ -z "${MILES_CMD:-}" ]] || RECORD_RC_FLAG=(--record-rc "$record_rc")
summary_rc=0
"$PY" -m harness.results.summary --gpu-checks "$OUT" --run-rc "$run_rc" --gap-rc "$gap_rc" "${RECORD_RC_FLAG[@]}" \
  || summary_rc=$?
log "(d) sglang conformance: $conf_rc (0 = every case passed; see $OUT/conformance.txt)"
if [[ $run_rc -ne 0 || $gap_rc -ne 0 || $record_rc -ne 0 || $summary_rc -ne 0 || ( $conf_rc != skipped && $conf_rc != 0 ) ]]; then
  log "FAILED: run exit $run_rc, gap exit $gap_rc, conformance $conf_rc, recorder exit $record_rc, summary exit $summary_rc"
  exit 1
fi
log "all checks passed"

