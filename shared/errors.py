"""Error types whose class names the workflow matches on: Retry for transient ones, Catch for the rest."""

from __future__ import annotations

from pydantic import ValidationError


class AnnotateError(Exception):
    """Base of the pipeline's own errors; the message is written for the user."""


class ImageRejected(AnnotateError):
    """The input is not an image this pipeline accepts (empty, truncated, too large, unknown format)."""


class ObjectMissing(ImageRejected):
    """The object an input names does not exist (deleted after it was planned, never written, a wrong key): rejected
    as an image that cannot be read, and named for what it is."""


class RequestRejected(AnnotateError):
    """A request or message breaks the contract (bad prompt, thresholds, vocabularies, sizes)."""


class ModelUnavailable(AnnotateError):
    """A model cannot be loaded from where the settings say; the message says what to do."""


class TransientError(AnnotateError):
    """A failure worth retrying (throttling, a storage hiccup)."""


def validation_reason(error: ValidationError) -> str:
    """One line naming each invalid field and why: 'prompt: Value error, prompt names nothing to detect'."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'message'}: {e['msg']}" for e in error.errors())
