"""Upstream Miles under the harness: find the tree (``source``), import stand-ins for what
cannot be installed on CPU (``stand_ins``), the virtual-time runner (``runner``), the seam registry (``seams``) and the
core-versus-upstream differential (``diff``). See ``docs/upstream.md``."""
