"""The kernel-level gap ablation on the tiny model (CPU): true on-policy is bitwise
exact, fp32 kernels differ only by float noise, bf16 is worse than fp32, and the
command writes a results file that loads."""

from __future__ import annotations

import json

import pytest
import torch

from harness.cli import main
from harness.measure.kernel_ablation import (
    Ablation,
    AblationConfig,
    TinySource,
    engine_generate,
    format_table,
    gap_row,
    replay_log_probs,
)
from harness.results.schema import load_results
from miles_async_core.errors import ConfigError
from miles_async_core.types import Sample

CFG = AblationConfig(dtypes=("fp32", "bf16"), num_seqs=6, max_new_tokens=12, tiny_d_model=64, tiny_layers=2, seed=3)


pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.model]  # fixture in the root conftest.py


@pytest.fixture(scope="module")
def rows() -> dict[tuple[str, str], dict]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {(r["factor"], r["setting"]): r for r in Ablation(CFG).rows()}
    finally:
        torch.set_num_threads(before)


def test_true_on_policy_recomputation_is_bitwise_equal_to_the_engine_log_probs():
    source = TinySource(CFG)
    ablation = Ablation(CFG, source)
    for dtype in ("fp32", "bf16"):
        model = source.build(dtype, "sdpa")
        samples = engine_generate(model, ablation.prompts, ablation.budgets, max_running=1, temperature=1.0, seed=3)
        for s in samples:
            replay = replay_log_probs(model, s, 1.0)
            assert torch.equal(replay, torch.tensor(s.rollout_log_probs, dtype=torch.float32)), dtype


def test_true_on_policy_rows_report_an_exactly_zero_gap(rows):
    for dtype in ("fp32", "bf16"):
        r = rows[("true_on_policy", dtype)]
        assert r["all_bitwise_equal"] and r["bitwise_equal_fraction"] == 1.0
        assert r["abs_diff_max"] == 0.0 and r["train_rollout_kl"] == 0.0


def test_fp32_eager_and_sdpa_differ_by_float_noise_only(rows):
    for setting in ("eager", "sdpa engine vs eager trainer"):
        r = rows[("attention", setting)]
        assert r["abs_diff_max"] < 1e-4, setting
    assert rows[("baseline", "fp32")]["abs_diff_max"] < 1e-4


def test_bf16_gap_is_larger_than_fp32s(rows):
    fp32 = rows[("baseline", "fp32")]
    for setting in ("bf16 (engine+trainer)", "bf16 engine vs fp32 trainer"):
        bf16 = rows[("dtype", setting)]
        assert bf16["abs_diff_mean"] > 10 * fp32["abs_diff_mean"], setting
        assert bf16["train_rollout_kl"] > fp32["train_rollout_kl"], setting


def test_every_factor_has_a_row_and_tf32_is_not_applicable_on_cpu(rows):
    factors = {f for f, _ in rows}
    assert factors == {"baseline", "dtype", "attention", "batch", "prefill", "matmul", "true_on_policy"}
    tf32 = rows[("matmul", "tf32 on")]
    assert tf32["note"] == "n/a (CPU)" and tf32["abs_diff_mean"] is None
    assert rows[("prefill", "token-by-token")]["abs_diff_max"] < 1e-4
    assert rows[("batch", "alone")]["num_tokens"] == rows[("baseline", "fp32")]["num_tokens"]
    assert "n/a (CPU)" in format_table(list(rows.values()))


def test_a_single_differing_token_breaks_bitwise_equality():
    s = Sample(prompt_tokens=[3], response_tokens=[4, 5], rollout_log_probs=[-1.0, -2.0])
    row = gap_row("f", "s", "e", "t", [s], [torch.tensor([-1.0, -2.0 + 2**-20])])
    assert not row["all_bitwise_equal"] and row["bitwise_equal_fraction"] == 0.5
    assert row["abs_diff_max"] == pytest.approx(2**-20)


def test_the_gap_command_writes_a_loadable_results_file(tmp_path, capsys):
    out = tmp_path / "gap"
    rc = main(
        [
            "gap",
            "--dtypes",
            "fp32",
            "--num-seqs",
            "3",
            "--max-new-tokens",
            "4",
            "--d-model",
            "32",
            "--layers",
            "1",
            "--out",
            str(out),
        ]
    )
    stdout = capsys.readouterr().out
    assert rc == 0
    res = load_results(out / "results.json")
    assert res.kind == "gap"
    bench = res.benchmarks["true_on_policy/fp32"]
    assert bench["unit"] == "nats/token" and bench["higher_is_better"] is False
    assert bench["samples"] == [0.0, 0.0, 0.0]
    # the table's rows: all but the header, 2 paths, the JSON line and the host-share lines
    # (one, and a NOT COMPARABLE line when the host was busy: harness.measure.host_load)
    lines = [x for x in stdout.strip().splitlines() if not x.startswith(("host share:", "NOT COMPARABLE:"))]
    assert len(res.extra["table"]) == len(lines) - 4
    assert json.loads(stdout.strip().splitlines()[-1])["true_on_policy_exact"] is True
    assert (out / "gap_table.md").read_text().count("| true_on_policy |") == 1


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--dtypes", "fp32,fp8"], "--dtypes"),
        (["--device", "tpu"], "--device"),
        (["--num-seqs", "1"], "--num-seqs"),
        (["--model", "no/such/dir"], "--model"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(tmp_path, capsys, argv, needle):
    assert main(["gap", *argv, "--out", str(tmp_path)]) == 2
    assert needle in capsys.readouterr().err


def test_cuda_is_refused_with_a_fix_when_torch_sees_no_gpu():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present, so --device cuda is valid here")
    with pytest.raises(ConfigError, match="--device cuda.*fix"):
        AblationConfig(device="cuda")


def test_the_mis_columns_say_what_a_mis_correction_would_reject(rows):
    for dtype in ("fp32", "bf16"):  # no gap: nothing to reject or veto
        r = rows[("true_on_policy", dtype)]
        assert r["mis_rs_mask_fraction"] == 0.0 and r["mis_rs_catastrophic_seq_fraction"] == 0.0
        assert r["mis_chi2_token"] == 0.0
    # one token of three out of mis.yaml's [0.5, 2] ratio band; one far below the 1e-4 veto
    high = Sample(prompt_tokens=[3], response_tokens=[4, 5, 6], rollout_log_probs=[-1.0, -1.0, -1.0])
    row = gap_row("f", "s", "e", "t", [high], [torch.tensor([-1.0, 0.0, -1.0])])
    assert row["mis_rs_mask_fraction"] == pytest.approx(1 / 3) and row["mis_rs_catastrophic_seq_fraction"] == 0.0
    row = gap_row("f", "s", "e", "t", [high], [torch.tensor([-1.0, -11.0, -1.0])])
    assert row["mis_rs_mask_fraction"] == pytest.approx(1 / 3) and row["mis_rs_catastrophic_seq_fraction"] == 1.0
    table = format_table([row])
    assert "MIS rejected" in table and "33.33%" in table and "MIS vetoed" in table
