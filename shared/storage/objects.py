"""Object storage behind one small interface: local files (local mode) and S3 (AWS), chosen by the URI."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote, unquote_to_bytes, urlparse

from shared.errors import ImageRejected, ObjectMissing, RequestRejected, TransientError


class ObjectStore(Protocol):
    def read_bytes(self, uri: str, max_bytes: int | None = None) -> bytes: ...
    def write_bytes(self, uri: str, data: bytes, content_type: str = "application/octet-stream") -> None: ...
    def write_once(self, uri: str, data: bytes, content_type: str = "application/octet-stream") -> bool:
        """Write ``data`` unless ``uri`` exists (then nothing is written): whether it was written."""
        ...

    def list_uris(self, prefix_uri: str) -> Iterator[str]: ...
    def list_fingerprinted(self, prefix_uri: str) -> Iterator[tuple[str, str]]: ...
    def delete(self, uri: str) -> None: ...
    def size(self, uri: str) -> int: ...
    def fingerprint(self, uri: str) -> str: ...


# The storage port: the store that holds a URI. Steps receive one (:func:`store_for` in functions, an in-memory
# one in tests) instead of reaching for a global.
StoreFor = Callable[[str], ObjectStore]


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def split_s3(uri: str) -> tuple[str, str]:
    parsed = urlparse(uri)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ValueError(f"not an S3 URI: {uri!r}")
    return parsed.netloc, parsed.path.lstrip("/")


def join_uri(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *(part.strip("/") for part in parts)])


def _too_large(uri: str, size: int, max_bytes: int) -> ImageRejected:
    return ImageRejected(f"{uri} is {size:,} bytes, over the limit of {max_bytes:,} bytes")


def local_path(uri: str) -> Path:
    """The path a plain path or a file:// URI names (its percent-escapes decoded to the file name's bytes)."""
    return Path(os.fsdecode(unquote_to_bytes(urlparse(uri).path))) if uri.startswith("file://") else Path(uri)


def local_uri(path: Path) -> str:
    """How a local file is named in messages, rows and JSON: its path, or, where the name is not valid UTF-8 (a
    file system allows any bytes), a file:// URI with those bytes percent-escaped."""
    try:
        str(path).encode()
    except UnicodeEncodeError:
        return "file://" + quote(os.fsencode(path))
    return str(path)


class LocalStore:
    """Plain paths and file:// URIs."""

    @staticmethod
    def _path(uri: str) -> Path:
        return local_path(uri)

    def read_bytes(self, uri: str, max_bytes: int | None = None) -> bytes:
        path = self._path(uri)
        if not path.is_file():
            broken = path.is_symlink() and not path.exists()
            reason = "is a broken symlink or a symlink loop" if broken else "does not exist or is not a file"
            raise ObjectMissing(f"{uri} {reason}")
        size = path.stat().st_size
        if max_bytes is not None and size > max_bytes:
            raise _too_large(uri, size, max_bytes)
        return path.read_bytes()

    def write_bytes(self, uri: str, data: bytes, content_type: str = "application/octet-stream") -> None:
        path = self._path(uri)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        try:
            partial.write_bytes(data)
            partial.replace(path)  # readers never see half a file
        except BaseException:  # a full disk, a signal: no half file is left either
            partial.unlink(missing_ok=True)
            raise

    def write_once(self, uri: str, data: bytes, content_type: str = "application/octet-stream") -> bool:
        path = self._path(uri)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.{id(data)}.partial")
        try:
            partial.write_bytes(data)
            os.link(partial, path)  # whole or not at all, and never over a file another writer made first
            return True
        except FileExistsError:
            return False
        finally:
            partial.unlink(missing_ok=True)

    def list_uris(self, prefix_uri: str) -> Iterator[str]:
        root = self._path(prefix_uri)
        if root.is_file():
            yield local_uri(root)
        elif root.is_dir():  # hidden files and what hidden folders hold (.thumbs/, .git/) are not the user's images
            for path in sorted(root.rglob("*")):
                if path.is_file() and not any(part.startswith(".") for part in path.relative_to(root).parts):
                    yield local_uri(path)

    def list_fingerprinted(self, prefix_uri: str) -> Iterator[tuple[str, str]]:
        """Each file under ``prefix_uri`` with :meth:`fingerprint`'s digest (a read of each file)."""
        yield from ((uri, self.fingerprint(uri)) for uri in self.list_uris(prefix_uri))

    def delete(self, uri: str) -> None:
        self._path(uri).unlink(missing_ok=True)

    def size(self, uri: str) -> int:
        return self._path(uri).stat().st_size

    def fingerprint(self, uri: str) -> str:
        """A digest of the content (of its first 64 MiB and its size, to bound the work), or 'missing'."""
        path = self._path(uri)
        if not path.is_file():
            return "missing"
        digest = hashlib.sha256(str(path.stat().st_size).encode())
        with path.open("rb") as file:
            digest.update(file.read(64 * 2**20))
        return digest.hexdigest()


@dataclass
class MemoryStore:
    """Every URI's bytes in one dict, and its own ``store_for``: one API request's upload and results, which are
    not kept (and the tests' storage)."""

    objects: dict[str, bytes] = field(default_factory=dict)

    def __call__(self, uri: str) -> ObjectStore:
        return self

    def read_bytes(self, uri: str, max_bytes: int | None = None) -> bytes:
        if uri not in self.objects:
            raise ObjectMissing(f"{uri} does not exist")
        data = self.objects[uri]
        if max_bytes is not None and len(data) > max_bytes:
            raise _too_large(uri, len(data), max_bytes)
        return data

    def write_bytes(self, uri: str, data: bytes, content_type: str = "application/octet-stream") -> None:
        self.objects[uri] = data

    def write_once(self, uri: str, data: bytes, content_type: str = "application/octet-stream") -> bool:
        return self.objects.setdefault(uri, data) is data

    def list_uris(self, prefix_uri: str) -> Iterator[str]:
        yield from sorted(uri for uri in self.objects if uri.startswith(prefix_uri))

    def list_fingerprinted(self, prefix_uri: str) -> Iterator[tuple[str, str]]:
        yield from ((uri, self.fingerprint(uri)) for uri in self.list_uris(prefix_uri))

    def delete(self, uri: str) -> None:
        self.objects.pop(uri, None)

    def size(self, uri: str) -> int:
        return len(self.objects[uri])

    def fingerprint(self, uri: str) -> str:
        return hashlib.sha256(self.objects[uri]).hexdigest() if uri in self.objects else "missing"


class S3Store:
    """S3 through boto3; throttling and 5xx surface as TransientError so the workflow retries them."""

    def __init__(self, client: Any) -> None:
        self._s3 = client

    def _call(self, operation: str, **kwargs: Any) -> Any:
        with _s3_errors(operation, kwargs):
            return getattr(self._s3, operation)(**kwargs)

    def read_bytes(self, uri: str, max_bytes: int | None = None) -> bytes:
        """One GET: the size is checked from its response before the body is read."""
        bucket, key = split_s3(uri)
        response = self._call("get_object", Bucket=bucket, Key=key)
        size = int(response["ContentLength"])
        if max_bytes is not None and size > max_bytes:
            response["Body"].close()
            raise _too_large(uri, size, max_bytes)
        return bytes(response["Body"].read())

    def write_bytes(self, uri: str, data: bytes, content_type: str = "application/octet-stream") -> None:
        bucket, key = split_s3(uri)
        self._call("put_object", Bucket=bucket, Key=key, Body=data, ContentType=content_type)

    def write_once(self, uri: str, data: bytes, content_type: str = "application/octet-stream") -> bool:
        """A conditional write: "you can use the If-None-Match header ... to check if the object exists ... If it
        does, the upload fails with a 412 Precondition Failed"; two at once, "a 409 Conflict" for one of them, "retry
        the write" (S3 User Guide, "How to prevent object overwrites with conditional writes")."""
        bucket, key = split_s3(uri)
        try:
            self._call("put_object", Bucket=bucket, Key=key, Body=data, ContentType=content_type, IfNoneMatch="*")
            return True
        except ObjectExists:
            return False

    def list_uris(self, prefix_uri: str) -> Iterator[str]:
        yield from (uri for uri, _ in self.list_fingerprinted(prefix_uri))

    def list_fingerprinted(self, prefix_uri: str) -> Iterator[tuple[str, str]]:
        """Each object under ``prefix_uri`` with its ETag, from the listing itself: no request per object."""
        bucket, prefix = split_s3(prefix_uri)
        pages = self._s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        with _s3_errors("list_objects_v2", {"Bucket": bucket, "Key": prefix}):  # a page's SlowDown as any request's
            for page in pages:
                for item in page.get("Contents", []):
                    if not item["Key"].endswith("/"):
                        yield f"s3://{bucket}/{item['Key']}", str(item["ETag"]).strip('"')

    def delete(self, uri: str) -> None:
        bucket, key = split_s3(uri)
        self._call("delete_object", Bucket=bucket, Key=key)

    def size(self, uri: str) -> int:
        bucket, key = split_s3(uri)
        return int(self._call("head_object", Bucket=bucket, Key=key)["ContentLength"])

    def fingerprint(self, uri: str) -> str:
        """The object's ETag (a content digest for single-part uploads), or 'missing'."""
        bucket, key = split_s3(uri)
        try:
            return str(self._call("head_object", Bucket=bucket, Key=key)["ETag"]).strip('"')
        except ObjectMissing:
            return "missing"


class ObjectExists(Exception):
    """A write refused because the object exists (S3's 412 to If-None-Match)."""


@contextmanager
def _s3_errors(operation: str, kwargs: dict[str, Any]) -> Iterator[None]:
    """What botocore gave up on, as the pipeline reads it: throttling and 5xx are TransientError, which the workflow
    retries; a missing key is ObjectMissing."""
    from botocore.exceptions import ClientError, ConnectionError, NoCredentialsError, ReadTimeoutError

    try:
        yield
    except (ConnectionError, ReadTimeoutError) as error:
        raise TransientError(f"S3 {operation} failed: {error}") from error
    except NoCredentialsError:  # on a laptop without AWS set up; a function always has its role's
        where = f"s3://{kwargs.get('Bucket', '')}/{kwargs.get('Key', '')}"
        raise RequestRejected(f"{where}: no AWS credentials here to read it (aws configure, or AWS_PROFILE)") from None
    except ClientError as error:
        code = error.response.get("Error", {}).get("Code", "")
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if code in {"SlowDown", "Throttling", "RequestTimeout", "ConditionalRequestConflict"} or status >= 500:
            raise TransientError(f"S3 {operation} failed: {error}") from error
        if code in {"NoSuchKey", "404", "NotFound"}:
            raise ObjectMissing(f"s3://{kwargs['Bucket']}/{kwargs.get('Key', '')} does not exist") from error
        if code == "PreconditionFailed":
            raise ObjectExists(f"s3://{kwargs['Bucket']}/{kwargs.get('Key', '')} exists") from error
        raise


@lru_cache(maxsize=1)
def _s3_store() -> S3Store:
    from shared.aws import client

    return S3Store(client("s3"))


def store_for(uri: str) -> ObjectStore:
    """The store that holds ``uri``: S3 for s3:// URIs, the local file system otherwise."""
    return _s3_store() if is_s3(uri) else LocalStore()


def refresh_clients() -> None:
    """The next S3 request opens a new client: after a SnapStart restore, or once the environment changed."""
    from shared.aws import refresh_clients as new_clients

    new_clients()
    _s3_store.cache_clear()
