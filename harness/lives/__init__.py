"""Runs that stop and resume from their checkpoint: a run is a sequence of *lives*.

One concept, one module, two hosts:

* ``stops``: where a life ends (``Stop``, ``StopPoint``), one vocabulary named after
  upstream's save order, and the one crash rule (``StopWatcher``, ``Crash``): a crash
  keeps what was written to the checkpoint folder by the loop step its stop event is in;
* ``run``: ``run_lives(scenario, stops, host)``, the one loop over lives, its
  ``LivesResult``, and the ``LifeHost`` protocol a host implements;
* ``core``: ``CoreHost``, the core's drivers in virtual time;
* ``harness.upstream.lives``: ``UpstreamHost``, upstream Miles' own drivers with
  upstream's own start-up, save and load (it imports upstream's code, so it lives with
  the other upstream modules);
* ``sweep``: the resume sweep, one scenario and one table for either host.

Same scenario, stops and host: the same trace.
"""

from harness.lives.run import LifeEnd, LifeHost, LivesResult, run_lives
from harness.lives.stops import Crash, Stop, StopPoint, StopWatcher, stop_named

__all__ = [
    "Crash",
    "LifeEnd",
    "LifeHost",
    "LivesResult",
    "Stop",
    "StopPoint",
    "StopWatcher",
    "run_lives",
    "stop_named",
]
