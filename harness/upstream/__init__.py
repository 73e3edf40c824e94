"""Upstream Miles under the harness: find the tree (``source``), the fakes at the leaves
(``leaves``, ``vray``; import fakes for what cannot be installed on CPU and the errors a
fake raises, ``leaf_fakes``), the virtual-time runner (``runner``), the seam registry (``seams``) and the
core-versus-upstream differential (``diff``). See ``docs/upstream.md``."""
