"""Error types whose class names the workflow matches on: Retry for transient ones, Catch for the rest."""

from __future__ import annotations


class AnnotateError(Exception):
    """Base of the pipeline's own errors; the message is written for the user."""


class ImageRejected(AnnotateError):
    """The input is not an image this pipeline accepts (empty, truncated, too large, unknown format)."""


class RequestRejected(AnnotateError):
    """A request or message breaks the contract (bad prompt, thresholds, vocabularies, sizes)."""


class ModelUnavailable(AnnotateError):
    """A model cannot be loaded from where the settings say; the message says what to do."""


class TransientError(AnnotateError):
    """A failure worth retrying (throttling, a storage hiccup)."""
