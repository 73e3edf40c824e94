"""The harness' fakes at upstream's leaves: the errors a fake raises when upstream reaches
past what it fakes (``LeafCalled``, ``LeafMissing``), the ``args`` namespace, and import
fakes for the upstream Miles tree, applied one by one, each only when the real import fails.

Upstream's rollout package imports a few modules it never calls on the code paths the
harness runs. Where the real package is small and installs on CPU it is installed
instead (the ``upstream`` extra in ``pyproject.toml``: ``ray``, ``sglang-router``,
``polars``, ``pybase64``, ``pylatexenc``, ``httpx``), and no fake is used for it.
What is left is below, each with the reason it cannot be the real thing. An import fake
only satisfies the import: every callable in it raises ``LeafCalled`` naming itself,
so a code path that does reach it fails loudly instead of computing something else.

``install()`` returns ``{module name: reason}`` for the fakes it applied (an empty
dict when every real import worked); ``APPLIED`` keeps the same record for reports.
"""

from __future__ import annotations

import argparse
import dis
import importlib
import sys
import types
from typing import Any


# every LeafCalled made since the process started; the runner reads the ones a run
# made (``host.UpstreamRunner.run``) and reports them as a harness error, not a finding
RAISED: list["LeafCalled"] = []
# set by a running host: called with each LeafCalled made, to stop the run at once
# (upstream may catch the error and go on, e.g. retrying a group forever)
ON_RAISE: Any = None


class LeafCalled(RuntimeError):
    """Upstream code reached a fake at a leaf: the run took a path the runner does not
    support. ``seam`` names the seam or fake; each one made is recorded in ``RAISED``, since
    upstream may catch it and log it as its own task error."""

    def __init__(self, message: str, *, seam: str = "import fake") -> None:
        super().__init__(message)
        self.seam = seam
        RAISED.append(self)
        if ON_RAISE is not None:
            ON_RAISE(self)


class LeafMissing(LeafCalled, AttributeError):
    """Upstream read a member the harness' fake for the leaf ``role`` (``harness.upstream.leaves``)
    does not have: the run cannot be faithful. Names the member and the upstream file:line
    that read it; an ``AttributeError`` too, so ``getattr(obj, name, default)`` in upstream
    still sees it as absent (the run is stopped all the same: it is recorded in ``RAISED``)."""

    def __init__(self, role: str, member: str, filename: str, lineno: int) -> None:
        self.role, self.member, self.where = role, member, f"{_tree_relative(filename)}:L{lineno}"
        super().__init__(
            f"the harness' fake for `{role}` has no member `{member}`, which upstream reads at "
            f"{self.where}: the harness cannot run this code path faithfully (a harness error, not an "
            f"upstream finding{_DOCTOR if role != 'args' else ''})",
            seam=f"leaf {role}.{member}",
        )
        self.name = member


class ArgsNamespace(argparse.Namespace):
    """The namespace Miles' own parser fills for a run (``harness.upstream.runner.upstream_args``).
    Upstream reading an argument neither that parser defines nor the runner sets
    (``args.name``: Megatron's, whose parser the train actor leaf replaces) is
    ``LeafMissing`` naming it and the line. Read through
    ``getattr(args, name, default)`` / ``hasattr``, it stays a plain ``AttributeError``:
    upstream's default applies, as it does for arguments Miles' parser may lack."""

    def __getattr__(self, name: str) -> Any:
        frame = sys._getframe(1)
        if name.startswith("__") or dis.opname[frame.f_code.co_code[frame.f_lasti]] not in ("LOAD_ATTR", "LOAD_METHOD"):
            raise AttributeError(name)
        raise LeafMissing("args", name, frame.f_code.co_filename, frame.f_lineno)


_DOCTOR = "; `miles-harness doctor` lists each leaf the harness fakes"


def _tree_relative(filename: str) -> str:
    """``filename`` relative to the upstream tree holding it (the nearest folder above it
    that is a Miles tree: the ``miles`` package and a driver, as
    ``harness.upstream.source.is_miles_tree`` has it; read here, since source imports this)."""
    from pathlib import Path

    path = Path(filename)
    for root in path.parents:
        if (root / "miles" / "__init__.py").is_file() and any(
            (root / d).is_file() for d in ("train.py", "train_async.py")
        ):
            return str(path.relative_to(root))
    return filename


def _raising(qualname: str, reason: str) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise LeafCalled(
            f"{qualname} is an import fake ({reason}); the harness runner does not support the code path that called it"
        )

    call.__qualname__ = call.__name__ = qualname.rpartition(".")[2]
    return call


class _RaisingClass:
    """A class placeholder: type annotations and ``isinstance`` work, construction and
    pydantic-style use raise."""

    _what = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise LeafCalled(f"{self._what} is an import fake")

    @classmethod
    def model_validate(cls, *args: Any, **kwargs: Any) -> Any:
        raise LeafCalled(f"{cls._what}.model_validate is an import fake")


def _dumper_config(qualname: str, reason: str) -> type:
    """``DumperConfig``: ``dumper_utils`` turns ``--dumper-<phase>`` key=value pairs into a
    dict on every rollout (``_get_phase_override_configs``); with none given that is ``{}``,
    anything else needs the real dumper."""

    def kv_pairs_to_dict(raw: Any) -> dict:
        if not raw:
            return {}
        raise LeafCalled(f"{qualname}._kv_pairs_to_dict({raw!r}): {reason}")

    return type(
        "DumperConfig", (_RaisingClass,), {"_what": qualname, "_kv_pairs_to_dict": staticmethod(kv_pairs_to_dict)}
    )


def _server_args(qualname: str, reason: str) -> type:
    """``ServerArgs``: Miles' parser registers SGLang's engine flags through
    ``ServerArgs.add_cli_args`` (``miles/backends/sglang_utils/arguments.py:L135``) as
    ``--sglang-*``. Without sglang, only the fields Miles' orchestration reads are added,
    with SGLang's defaults; the rest only configure the engine process (a leaf)."""

    def add_cli_args(cls: type, parser: Any) -> None:
        for flag in ("--tp-size", "--dp-size", "--pp-size", "--ep-size"):
            parser.add_argument(flag, type=int, default=1)
        parser.add_argument("--enable-dp-attention", action="store_true")
        parser.add_argument("--enable-deterministic-inference", action="store_true")
        parser.add_argument("--speculative-algorithm", type=str, default=None)
        parser.add_argument("--cuda-graph-backend-prefill", type=str, default=None)

    return type("ServerArgs", (_RaisingClass,), {"_what": qualname, "add_cli_args": classmethod(add_cli_args)})


def _cls(qualname: str) -> type:
    return type(qualname.rpartition(".")[2], (_RaisingClass,), {"_what": qualname})


# module -> (reason, {attribute: factory(qualified name, reason)})
IMPORT_FAKES: dict[str, tuple[str, dict[str, Any]]] = {
    # `miles/utils/dumper_utils.py` imports SGLang's debug dumper at module level; it is used
    # only when --dumper-* flags enable the inference dump phase, which the runner never sets.
    # The real module lives in the `sglang` package, which pins its own CUDA torch and is
    # several GB: not installable next to this harness' CPU torch.
    "sglang.srt.debug_utils.dumper": (
        "SGLang's debug dumper; the sglang package pins a CUDA torch and is not installed on CPU; "
        "used only with --dumper-* flags",
        {"DumperConfig": _dumper_config, "_get_rank": _raising, "dumper": lambda q, r: _cls(q)},
    ),
    # `miles/utils/chat_template_utils/template.py` and `deepseek.py` import the OpenAI protocol
    # `Tool` model for tool-calling chat templates; the runner's prompts are plain strings.
    "sglang.srt.entrypoints.openai.protocol": (
        "SGLang's OpenAI protocol models (sglang is not installed on CPU); used only for tool-calling "
        "chat templates, which the runner's plain-string prompts never apply",
        {"Tool": lambda q, r: _cls(q)},
    ),
    # `encoding_dsv4` exists only on Miles' SGLang fork (branch sglang-miles), which is not
    # public at the pinned commit; `deepseek.py` imports it for DeepSeek-V4 chat templates.
    "sglang.srt.entrypoints.openai.encoding_dsv4": (
        "exists only on Miles' SGLang fork (sglang-miles), not public; used only by the DeepSeek-V4 chat template",
        {"encode_messages": _raising},
    ),
    # `train.py` imports SGLang's memory-type tags for --offload-rollout; `miles/ray/rollout/*`
    # (imported through the drivers' `miles.ray.placement_group`) imports them too. The runner
    # replaces the Ray rollout manager, so the tags are only names here.
    "sglang.srt.constants": (
        "SGLang memory-type tags (sglang is not installed on CPU); only passed to the Ray rollout manager, "
        "which the runner replaces",
        {
            "GPU_MEMORY_TYPE_CUDA_GRAPH": lambda q, r: "cuda_graph",
            "GPU_MEMORY_TYPE_KV_CACHE": lambda q, r: "kv_cache",
            "GPU_MEMORY_TYPE_WEIGHTS": lambda q, r: "weights",
        },
    ),
    # `miles/utils/arguments.py` (imported by both drivers) builds SGLang's server arguments;
    # the runner builds its own args namespace and never calls upstream's parser.
    "sglang.srt.server_args": (
        "SGLang's ServerArgs (sglang is not installed on CPU); upstream's argument parser registers its engine "
        "flags, of which the orchestration reads the parallel sizes",
        {"ServerArgs": _server_args},
    ),
    # Request tracing hooks imported by the router/engine launch code under `miles/ray`.
    "sglang.srt.tracing.trace": (
        "SGLang request tracing (sglang is not installed on CPU); used only by the real engine/router "
        "launch code, which the runner replaces",
        {
            name: _raising
            for name in (
                "process_tracing_init",
                "trace_get_remote_propagate_context",
                "trace_req_finish",
                "trace_req_start",
                "trace_set_thread_info",
                "trace_slice_end",
                "trace_slice_start",
            )
        },
    ),
    "sglang.srt.utils": (
        "SGLang utilities (sglang is not installed on CPU); kill_process_tree is used only to stop real "
        "engine processes",
        {"kill_process_tree": _raising},
    ),
}

APPLIED: dict[str, str] = {}


def _real_import_works(name: str) -> bool:
    if name in sys.modules and not getattr(sys.modules[name], "__miles_harness_fake__", False):
        return True
    try:
        importlib.import_module(name)
        return True
    except ImportError:
        return False


def _ensure_parents(name: str) -> None:
    parts = name.split(".")
    for i in range(1, len(parts)):
        parent = ".".join(parts[:i])
        if parent in sys.modules:
            continue
        try:
            importlib.import_module(parent)
        except ImportError:
            mod = types.ModuleType(parent)
            mod.__path__ = []  # a namespace-like package, so children can be registered
            mod.__miles_harness_fake__ = True  # type: ignore[attr-defined]
            sys.modules[parent] = mod
        if i > 1:
            setattr(sys.modules[".".join(parts[: i - 1])], parts[i - 1], sys.modules[parent])


def install() -> dict[str, str]:
    """Apply every import fake whose real module cannot be imported; idempotent."""
    for name, (reason, attrs) in IMPORT_FAKES.items():
        if name in APPLIED or _real_import_works(name):
            continue
        _ensure_parents(name)
        mod = types.ModuleType(name, f"miles-harness import fake: {reason}")
        mod.__miles_harness_fake__ = True  # type: ignore[attr-defined]
        for attr, make in attrs.items():
            setattr(mod, attr, make(f"{name}.{attr}", reason))
        sys.modules[name] = mod
        parent, _, leaf = name.rpartition(".")
        setattr(sys.modules[parent], leaf, mod)
        APPLIED[name] = reason
    return dict(APPLIED)
