"""From a prompt message to batch manifests: expand folders and prefixes, name images and batches by content."""

from __future__ import annotations

import hashlib
from pathlib import Path

from shared.contracts import AnnotationRequest, BatchManifest, ImageRef, PromptMessage
from shared.storage import StoreFor, is_s3


def expand_locations(locations: list[str], store_for: StoreFor) -> list[str]:
    """Every image a message names: files as they are, local folders and S3 prefixes ending in '/' expanded.

    A location that does not exist is kept, so that it ends as a failure row rather than silently vanishing.
    """
    expanded: list[str] = []
    for location in locations:
        if is_s3(location):
            found = list(store_for(location).list_uris(location)) if location.endswith("/") else [location]
        else:
            path = Path(location).expanduser().resolve()
            found = list(store_for(str(path)).list_uris(str(path))) if path.is_dir() else [str(path)]
        expanded.extend(uri for uri in found if uri not in expanded)
    return expanded


def image_ref(uri: str, store_for: StoreFor) -> ImageRef:
    fingerprint = store_for(uri).fingerprint(uri)
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
    refs = [image_ref(uri, store_for) for uri in expand_locations(message.images, store_for)]
    size = max_images_per_batch
    chunks = [refs[start : start + size] for start in range(0, len(refs), size)]
    return [
        BatchManifest(batch_id=batch_id(request, chunk), request=request, images=chunk, results_uri=results_uri)
        for chunk in chunks
    ]
