"""An SGLang-compatible HTTP server on the CPU, backed by the harness's torch engine.

``miles-harness serve`` (``harness.commands.serve``) and the Python API
(``harness.serve.server.serve_in_thread`` / ``ServedEngine``) start it; see
``docs/serve.md``. Layout:

* ``engine.py``: ``EngineHost``, the state behind the routes: an ``EngineCore`` (the
  harness's continuous-batching engine with real abort / retract / in_place pauses)
  driven by one thread, SGLang's weight-version strings, the trace and request log;
* ``app.py``: the FastAPI routes and SGLang's error shapes;
* ``weights.py``: decoding ``update_weights_from_tensor`` payloads and loading
  ``update_weights_from_disk`` directories;
* ``order.py``: the weight-update call order checked against the request log;
* ``server.py``: building a host for ``--model`` and running uvicorn in a thread.

Nothing here is imported by the rest of the harness; the web stack (the ``serve``
extra) is needed only when these modules are.
"""
