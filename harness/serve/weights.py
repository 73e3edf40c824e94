"""Weight payloads of SGLang's update endpoints, decoded without trusting the sender.

``/update_weights_from_tensor``: SGLang's ``serialized_named_tensors`` is one string per
tensor-parallel rank, each ``MultiprocessingSerializer.serialize(named_tensors,
output_str=True)``: base64 of a pickle of ``[(name, tensor), ...]`` (Miles builds it in
``update_weight_from_tensor.py``; SGLang reads it in ``MultiprocessingSerializer.
deserialize``). This server runs one rank, so it reads the first string. Two pickles
are accepted, both through an unpickler that resolves only the torch and standard-library
names below (anything else is refused, never imported):

* a plain ``pickle`` (tensor bytes inside the payload): works from any process;
  ``encode_named_tensors`` writes it;
* torch's ``ForkingPickler`` (what SGLang's serializer uses; CPU tensors travel as
  shared-memory handles): works from the server's own process (``serve_in_thread``)
  or a sender using the ``file_system`` sharing strategy.

``load_format="flattened_bucket"`` (SGLang's ``FlattenedTensorBucket``, whose metadata
are sglang classes) is refused with a message saying so.

``/update_weights_from_disk``: ``model_path`` is a directory of ``*.safetensors`` files
(or ``*.bin`` / ``*.pt`` state dicts, read with ``weights_only=True``) whose names are
the engine model's; ``save_weights_dir`` writes one.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import pickle
from typing import Any, Iterable

import torch

from .served_errors import ServeError

_DTYPE_NAMES = {name for name in dir(torch) if isinstance(getattr(torch, name, None), torch.dtype)}


def _load_storage_bytes(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=True)


_ALLOWED: dict[tuple[str, str], Any] = {
    ("torch._utils", "_rebuild_tensor_v2"): None,
    ("torch._utils", "_rebuild_parameter"): None,
    ("torch.storage", "_load_from_bytes"): _load_storage_bytes,
    ("torch.storage", "UntypedStorage"): None,
    ("torch", "Tensor"): None,
    ("torch", "Size"): None,
    ("torch.nn.parameter", "Parameter"): None,
    ("collections", "OrderedDict"): None,
    ("torch.multiprocessing.reductions", "rebuild_tensor"): None,
    ("torch.multiprocessing.reductions", "rebuild_typed_storage"): None,
    ("torch.multiprocessing.reductions", "rebuild_storage_fd"): None,
    ("torch.multiprocessing.reductions", "rebuild_storage_filename"): None,
    ("torch.multiprocessing.reductions", "rebuild_storage_empty"): None,
    ("multiprocessing.resource_sharer", "DupFd"): None,
}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and name in _DTYPE_NAMES:
            return getattr(torch, name)
        if (module, name) not in _ALLOWED:
            raise ServeError(
                f"serialized_named_tensors refers to {module}.{name}, which this server does not load; "
                "allowed: tensors pickled as SGLang's MultiprocessingSerializer or "
                "harness.serve.weights.encode_named_tensors writes them."
            )
        replacement = _ALLOWED[(module, name)]
        return replacement if replacement is not None else super().find_class(module, name)


def encode_named_tensors(named: Iterable[tuple[str, torch.Tensor]] | dict[str, torch.Tensor]) -> str:
    """One rank's ``serialized_named_tensors`` entry, readable by this server and by
    SGLang's ``MultiprocessingSerializer.deserialize`` (a base64 pickle)."""
    items = named.items() if isinstance(named, dict) else named
    payload = [(str(k), v.detach().to("cpu").contiguous().clone()) for k, v in items]
    return base64.b64encode(pickle.dumps(payload, protocol=4)).decode("ascii")


def decode_named_tensors(serialized: Any, load_format: str | None) -> dict[str, torch.Tensor]:
    if load_format not in (None, "direct"):
        raise ServeError(
            f"load_format={load_format!r} is not supported by this server; allowed: null (a pickled "
            "list of (name, tensor) pairs, SGLang's default). Fix: send unflattened named tensors."
        )
    if isinstance(serialized, str):
        serialized = [serialized]
    if not isinstance(serialized, list) or not serialized or not all(isinstance(s, (str, bytes)) for s in serialized):
        raise ServeError(
            "serialized_named_tensors must be a non-empty list of base64 strings, one per "
            "tensor-parallel rank. Fix: send [encode_named_tensors(named)]."
        )
    data = serialized[0]
    try:
        raw = base64.b64decode(data, validate=True) if isinstance(data, str) else data
        obj = _RestrictedUnpickler(io.BytesIO(raw)).load()
    except ServeError:
        raise
    except (
        binascii.Error,
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        TypeError,
        AttributeError,
        RuntimeError,
        OSError,
    ) as exc:
        raise ServeError(
            f"serialized_named_tensors[0] is not a base64 pickle of named tensors ({exc}). "
            "Fix: build it with harness.serve.weights.encode_named_tensors."
        ) from None
    items = obj.items() if isinstance(obj, dict) else obj
    out: dict[str, torch.Tensor] = {}
    try:
        for name, tensor in items:
            if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
                raise TypeError(f"entry ({type(name).__name__}, {type(tensor).__name__})")
            out[name] = tensor
    except (TypeError, ValueError) as exc:
        raise ServeError(f"serialized_named_tensors[0] must hold (name, tensor) pairs; got {exc}.") from None
    return out


def save_weights_dir(state_dict: dict[str, torch.Tensor], path: str | os.PathLike) -> str:
    """Write ``state_dict`` as ``path/model.safetensors`` (for ``update_weights_from_disk``)."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    target = os.path.join(path, "model.safetensors")
    save_file({k: v.detach().to("cpu").contiguous().clone() for k, v in state_dict.items()}, target)
    return target


def load_weights_dir(path: str) -> dict[str, torch.Tensor]:
    if not isinstance(path, str) or not os.path.isdir(path):
        raise ServeError(
            f"model_path={path!r} is not a directory; allowed: a directory of *.safetensors "
            "(or *.bin / *.pt state dicts) with the model's parameter names."
        )
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    out: dict[str, torch.Tensor] = {}
    if files:
        from safetensors.torch import load_file

        for f in files:
            out.update(load_file(os.path.join(path, f)))
        return out
    files = sorted(f for f in os.listdir(path) if f.endswith((".bin", ".pt")))
    if not files:
        raise ServeError(
            f"model_path={path!r} holds no *.safetensors, *.bin or *.pt file. Fix: write one with "
            "harness.serve.weights.save_weights_dir."
        )
    for f in files:
        try:
            out.update(torch.load(os.path.join(path, f), map_location="cpu", weights_only=True))
        except Exception as exc:
            raise ServeError(f"{os.path.join(path, f)}: not a loadable state dict ({exc}).") from None
    return out
