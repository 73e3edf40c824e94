"""The trace a server writes is readable by ``check-trace`` on its own
(``harness.serve.check.write_served_trace``): it carries the config the server's checks
run under, so the command's verdict is the server's."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from harness.cli import main as cli
from harness.serve.check import served_pause_mode, write_served_trace
from harness.trace import Event


def _pause(mode: str, implicit: bool = False) -> Event:
    fields = {"mode": mode, "in_flight": 0, **({"implicit": True} if implicit else {})}
    return Event(seq=0, t=0.0, kind="engine_pause", fields=fields)


def test_the_pause_mode_is_the_clients_one_mode_else_retract():
    assert served_pause_mode([_pause("abort"), _pause("retract", implicit=True), _pause("abort")]) == "abort"
    assert served_pause_mode([_pause("in_place")]) == "in_place"
    assert served_pause_mode([_pause("abort"), _pause("in_place")]) == "retract"  # mixed: the server's default
    assert served_pause_mode([_pause("abort", implicit=True)]) == "retract"
    assert served_pause_mode([]) == "retract"


def _body(seed: int) -> dict:
    return {"input_ids": [1, 5, 9], "sampling_params": {"max_new_tokens": 6, "sampling_seed": seed}}


@pytest.mark.http
@pytest.mark.model
@pytest.mark.parametrize("served_engine", [{"eos_token_id": None}], indirect=True)
def test_check_trace_reads_a_served_trace_with_its_config_and_agrees_with_the_server(served_engine, tmp_path, capsys):
    async def go():
        async with httpx.AsyncClient(base_url=served_engine.url, timeout=60) as c:
            await asyncio.gather(*[c.post("/generate", json=_body(s)) for s in (1, 2, 3)])
            assert (await c.post("/pause_generation", json={"mode": "abort"})).status_code == 200
            assert (await c.post("/continue_generation", json={})).status_code == 200
            await c.post("/generate", json=_body(4))

    asyncio.run(go())
    served_engine.stop()
    trace = tmp_path / "served.jsonl"
    doc = write_served_trace(served_engine.engine, trace)
    assert doc["config"]["pause_generation_mode"] == "abort" and doc["complete"] is False
    assert json.loads((tmp_path / "served.config.json").read_text()) == doc
    assert len(json.loads((tmp_path / "served.jsonl.requests.json").read_text())) >= 6

    code = cli(["check-trace", str(trace)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"config: {tmp_path / 'served.config.json'}; checked as a prefix" in out
    assert served_engine.check(pause_generation_mode="abort")["violations"] == []
