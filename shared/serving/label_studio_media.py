"""A Label Studio task's image: where it is, found without reading it, and its bytes, read as Label Studio serves
them: its own uploads and local files (a path on ``LABEL_STUDIO_URL``, read with ``LABEL_STUDIO_API_KEY``), or
``s3://`` in a bucket the deployment reads."""

from __future__ import annotations

import functools
import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from shared.errors import ImageRejected, RequestRejected
from shared.serving.calls import Source, image_source
from shared.serving.label_studio import Project, original_name
from shared.serving.secrets import secret_value
from shared.settings import Settings

DOWNLOAD_TIMEOUT_S = 30
URL_SAFE = ":/?#[]@!$&'()*+,;=%~"  # RFC 3986's reserved characters and '%': only the rest is percent-encoded


@dataclass(frozen=True)
class TaskImage:
    """Where a task's image lives, found without reading it, or why it cannot be read."""

    task: Any
    location: str = ""  # what is read: Label Studio's URL for it, or an s3:// or data: URI
    name: str = ""  # its file name where it came from
    error: str | None = None

    @property
    def task_id(self) -> Any:
        return self.task.get("id") if isinstance(self.task, dict) else None

    @property
    def kept(self) -> bool:
        """In storage (an s3:// location): its rows name this very URI."""
        return self.location.startswith("s3://")


def locate_task_image(task: Any, project: Project, settings: Settings) -> TaskImage:
    """Where the task's image is, checked without reading it: a task that is not a task, names no image, or one
    elsewhere than Label Studio or an s3:// location gets the reason instead."""
    data = task.get("data") if isinstance(task, dict) else None
    if not isinstance(data, dict):
        return TaskImage(task, error=f"the task's data is not an object ({type(data).__name__})")
    value = data.get(project.image_key)
    if not isinstance(value, str) or not value:
        return TaskImage(task, error=f"the task has no {project.image_key!r} in its data")
    if value.startswith(("s3://", "data:")):
        return TaskImage(task, value, original_name(value))
    base = settings.label_studio_url.rstrip("/")
    if not base:
        return TaskImage(
            task, error=f"{value[:120]!r} is Label Studio's: set LABEL_STUDIO_URL (and LABEL_STUDIO_API_KEY)"
        )
    # Label Studio's own paths hold its files' names as they were uploaded (spaces, accents): a request line takes
    # them percent-encoded, and what is encoded already stays as it is
    url = quote(f"{base}{value}" if value.startswith("/") else value, safe=URL_SAFE)
    if not url.startswith(f"{quote(base, safe=URL_SAFE)}/"):
        return TaskImage(
            task, error=f"{value[:120]!r} is neither on Label Studio ({base}) nor s3:// in an input bucket"
        )
    return TaskImage(task, url, original_name(value))


def read_task_image(image: TaskImage, settings: Settings, authorization: Callable[[], str]) -> Source:
    """The task's image, read as Label Studio serves it; ``authorization`` gives the header for Label Studio (one
    token exchange per call of /predict, not per task).

    Raises:
        RequestRejected: the task names no image it may read, or one Label Studio would not give.
        ImageRejected: the image is too large, or gone.
    """
    if image.error is not None:
        raise RequestRejected(image.error)
    if image.location.startswith(("s3://", "data:")):
        return image_source(image.location, settings, name=image.name)
    return image_source(_download(image.location, authorization(), settings.max_image_bytes), settings, name=image.name)


def task_image(task: Any, project: Project, settings: Settings) -> Source:
    """:func:`read_task_image` of a task on its own."""
    return read_task_image(
        locate_task_image(task, project, settings), settings, functools.partial(authorization_header, settings)
    )


def authorization_header(settings: Settings) -> str:
    """Label Studio's header for the key: a personal access token (a JWT) is exchanged for an access token at
    ``/api/token/refresh`` ("Authorization: Bearer"); a legacy token is sent as it is ("Authorization: Token")."""
    key = settings.label_studio_api_key.get_secret_value() or (
        secret_value(settings.label_studio_api_key_secret) if settings.label_studio_api_key_secret else ""
    )
    if key.count(".") != 2:
        return f"Token {key}"
    refresh = urllib.request.Request(
        f"{settings.label_studio_url.rstrip('/')}/api/token/refresh/",
        data=json.dumps({"refresh": key}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(refresh, timeout=DOWNLOAD_TIMEOUT_S) as answer:
            return f"Bearer {json.load(answer)['access']}"
    except (urllib.error.URLError, ValueError, KeyError) as error:
        raise RequestRejected(f"Label Studio refused LABEL_STUDIO_API_KEY: {error}") from None


class _KeyStaysHome(urllib.request.HTTPRedirectHandler):
    """Follows Label Studio's redirects (a cloud storage's presigned URL) without the key: it is Label Studio's, and
    a presigned URL is refused with a second means of authentication."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        redirected = super().redirect_request(req, fp, code, msg, headers, newurl)
        if redirected is not None and urlsplit(newurl).netloc != urlsplit(req.full_url).netloc:
            redirected.remove_header("Authorization")
        return redirected


_OPENER = urllib.request.build_opener(_KeyStaysHome)


def _download(url: str, authorization: str, max_bytes: int) -> bytes:
    request = urllib.request.Request(url, headers={"Authorization": authorization})
    try:
        with _OPENER.open(request, timeout=DOWNLOAD_TIMEOUT_S) as answer:
            data: bytes = answer.read(max_bytes + 1)
    except urllib.error.HTTPError as error:
        raise RequestRejected(f"Label Studio answered {error.code} for {url[:160]}") from None
    except (urllib.error.URLError, TimeoutError, ValueError, http.client.HTTPException) as error:
        raise RequestRejected(f"Label Studio could not be read at {url[:160]}: {error}") from None
    if len(data) > max_bytes:
        raise ImageRejected(f"{url[:160]} is over the limit of {max_bytes:,} bytes")
    return data
