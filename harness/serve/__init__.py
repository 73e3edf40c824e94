"""An SGLang-compatible HTTP server on the CPU, backed by the harness's torch engine.

``miles-harness serve`` (``harness.commands.serve``) and the Python API
(``harness.serve.server.serve_in_thread`` / ``RunningServer``) start it; see
``docs/serve.md``. Layout:

* ``served_core.py``: ``ServedCore``, the harness's continuous-batching ``EngineCore``
  (real abort / retract / in_place pauses) with per-request sampling options, stop
  conditions and an abort of one request that keeps its tokens;
* ``sampling.py``: SGLang's ``sampling_params``, parsed and applied to the logits;
* ``served_engine.py``: ``ServedEngine``, the state behind the routes: the core driven by
  one thread, SGLang's weight-version strings, streaming progress, the trace and
  request log;
* ``responses.py``: ``/generate``'s output and ``meta_info``;
* ``app.py`` (control, weights, scheduler state, health, harness routes, error shapes),
  ``generate_routes.py`` (``/generate``, streaming), ``openai_routes.py``
  (``/v1/completions``, ``/v1/chat/completions``);
* ``tokenizer.py``: the default model's tokenizer (characters with a byte fallback) and
  its chat template;
* ``weights.py``: decoding ``update_weights_from_tensor`` payloads and loading
  ``update_weights_from_disk`` directories;
* ``order.py`` and ``check.py``: the weight-update call order and the trace checks;
* ``uvicorn_thread.py``: one ASGI app on uvicorn in a thread (the server and the
  end-to-end runs' router); ``server.py``: ``build_engine`` and ``RunningServer``.

Nothing here is imported by the rest of the harness; the web stack (the ``serve``
extra) is needed only when these modules are.
"""
