"""Safe image decoding: bounded bytes and pixels, the formats we accept, one RGB picture as a viewer shows it."""

from __future__ import annotations

import hashlib
import io
import warnings
from dataclasses import dataclass

import numpy as np
import pi_heif
from PIL import Image, ImageOps, UnidentifiedImageError

from shared.errors import ImageRejected
from shared.settings import ImageLimits
from shared.storage.objects import StoreFor

# HEIF: an iPhone's photos (HEIC) and other phones', decoded by pi-heif (pillow-heif's decoder-only build: libheif and
# libde265, 4 MB where the encoder's x265 would add 23 to a Lambda package); AVIF by Pillow's own plugin
ACCEPTED_FORMATS = frozenset({"JPEG", "MPO", "PNG", "GIF", "WEBP", "BMP", "TIFF", "HEIF", "AVIF"})
pi_heif.register_heif_opener()


@dataclass(frozen=True)
class LoadedImage:
    """A decoded image: RGB, EXIF orientation applied; ``source_format`` as the file declared it;
    ``content_sha256`` the digest of the bytes it was decoded from (what the rows keep, so that the same picture
    under another name is found by a lookup)."""

    pixels: Image.Image
    source_format: str
    content_sha256: str = ""

    @property
    def width(self) -> int:
        return self.pixels.width

    @property
    def height(self) -> int:
        return self.pixels.height


def load_image(uri: str, store_for: StoreFor, limits: ImageLimits) -> LoadedImage:
    """Read (one request) and decode the image at ``uri`` within the byte and pixel limits.

    Raises:
        ImageRejected: the file is missing, empty, too large, not an accepted image, or corrupt.
    """
    data = store_for(uri).read_bytes(uri, max_bytes=limits.max_image_bytes)
    return decode_image(data, max_pixels=limits.max_image_pixels)


def decode_image(data: bytes, *, max_pixels: int) -> LoadedImage:
    """Decode ``data`` into an RGB image; the pixel bound is checked from the header, before decoding."""
    if not data:
        raise ImageRejected("file is empty")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
    except UnidentifiedImageError as error:
        raise ImageRejected("not an image, or a format that is not accepted") from error
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        raise ImageRejected(f"refused as a decompression bomb: {error}") from error
    except Exception as error:  # a damaged header: Pillow's plugins raise what their parsers meet (struct, index...)
        raise ImageRejected(f"a damaged image header: {type(error).__name__}: {error}") from error
    if image.format not in ACCEPTED_FORMATS:
        raise ImageRejected(f"{image.format} images are not accepted; use one of {sorted(ACCEPTED_FORMATS)}")
    width, height = image.size
    if width * height > max_pixels:
        raise ImageRejected(f"{width}x{height} is {width * height:,} pixels, over the limit of {max_pixels:,}")
    source_format = image.format
    try:
        image.seek(0)  # animated GIF/WebP: the first frame
        image.load()
        pixels = _to_rgb(ImageOps.exif_transpose(image))
    except Exception as error:  # Pillow's ways of saying truncated or corrupt: OSError, SyntaxError, struct...
        raise ImageRejected(f"truncated or corrupt {source_format} image: {error}") from error
    return LoadedImage(pixels=pixels, source_format=source_format, content_sha256=hashlib.sha256(data).hexdigest())


def _to_rgb(image: Image.Image) -> Image.Image:
    if image.mode.startswith("I;16"):
        # 16-bit grayscale: Pillow's own convert clips at 255 (nearly all white), so scale to 8 bits.
        values = np.asarray(image, dtype=np.float64) / 257.0
        image = Image.fromarray(values.round().astype(np.uint8), mode="L")
    elif image.mode in {"I", "F"}:
        values = np.asarray(image, dtype=np.float64)
        low, high = float(values.min()), float(values.max())
        scaled = (values - low) * (255.0 / (high - low)) if high > low else np.zeros_like(values)
        image = Image.fromarray(scaled.round().astype(np.uint8), mode="L")
    if image.mode == "P":
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
    if image.mode in {"RGBA", "LA", "PA", "RGBa", "La"}:
        # Transparent areas become white, as most viewers show them.
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")
