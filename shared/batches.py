"""From a prompt message to batch manifests: expand folders and prefixes, name images and batches by content."""

from __future__ import annotations

import hashlib
from pathlib import Path

from shared.contracts import AnnotationRequest, BatchManifest, ImageRef, PromptMessage
from shared.storage import StoreFor, is_s3


def expand_locations(locations: list[str], store_for: StoreFor) -> dict[str, str]:
    """Every image a message names, with its fingerprint (content digest, or S3's ETag): files as they are, local
    folders and S3 prefixes ending in '/' expanded. A prefix's ETags come from its listing (one request per 1,000
    objects); a named object costs one HEAD.

    A location that does not exist is kept (fingerprint 'missing'), so that it ends as a failure row rather than
    silently vanishing.
    """
    found: dict[str, str] = {}
    for location in locations:
        if not is_s3(location):
            location = str(Path(location).expanduser().resolve())
        store = store_for(location)
        folder = location.endswith("/") if is_s3(location) else Path(location).is_dir()
        listed = store.list_fingerprinted(location) if folder else [(location, store.fingerprint(location))]
        for uri, fingerprint in listed:
            found.setdefault(uri, fingerprint)
    return found


def image_ref(uri: str, fingerprint: str) -> ImageRef:
    return ImageRef(image_id=hashlib.sha256(f"{uri}\0{fingerprint}".encode()).hexdigest()[:16], source_uri=uri)


def batch_id(request: AnnotationRequest, images: list[ImageRef]) -> str:
    """Derived from the images' content and the request, so the same inputs and options name the same batch."""
    digest = hashlib.sha256(request.model_dump_json().encode())
    for image in sorted(images, key=lambda ref: ref.image_id):
        digest.update(image.image_id.encode())
    return f"b-{digest.hexdigest()[:20]}"


def plan_batches(
    message: PromptMessage, max_images_per_batch: int, results_uri: str, store_for: StoreFor
) -> list[BatchManifest]:
    """The manifests of the executions that annotate everything ``message`` names."""
    request = message.request()
    refs = [image_ref(uri, fingerprint) for uri, fingerprint in expand_locations(message.images, store_for).items()]
    size = max_images_per_batch
    chunks = [refs[start : start + size] for start in range(0, len(refs), size)]
    return [
        BatchManifest(batch_id=batch_id(request, chunk), request=request, images=chunk, results_uri=results_uri)
        for chunk in chunks
    ]
