"""Gone: the resume sweep on upstream is ``miles-harness resume-sweep --host upstream`` (or
``--host core,upstream``, one table with the core's rows beside upstream's), run by
``harness.lives.sweep``. This module only says so, for the old command line."""

import sys

if __name__ == "__main__":
    print(
        "python -m harness.upstream.resume_sweep: replaced by the one resume sweep. Fix: run "
        "`miles-harness resume-sweep --host upstream [--miles-src PATH] [--fast] [--json OUT.json]` "
        "(--host core,upstream for the core's rows beside upstream's)",
        file=sys.stderr,
    )
    sys.exit(2)
