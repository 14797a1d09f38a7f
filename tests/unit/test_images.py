from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from shared.errors import ImageRejected, ObjectMissing
from shared.settings import Settings
from shared.storage.images import decode_image, load_image
from shared.storage.objects import store_for
from tests.conftest import SAMPLES, encode, phone_photo

MAX_PIXELS = 40_000_000


def gradient(mode: str = "RGB", size: tuple[int, int] = (64, 48)) -> Image.Image:
    x = np.linspace(0, 255, size[0], dtype=np.uint8)
    rgb = np.stack([np.tile(x, (size[1], 1))] * 3, axis=-1)
    return Image.fromarray(rgb).convert(mode)


@pytest.mark.parametrize(
    ("fmt", "mode"),
    [
        ("JPEG", "RGB"),
        ("JPEG", "CMYK"),
        ("JPEG", "L"),
        ("PNG", "RGB"),
        ("PNG", "LA"),
        ("WEBP", "RGB"),
        ("BMP", "RGB"),
        ("TIFF", "RGB"),
        ("TIFF", "CMYK"),
        ("GIF", "P"),
    ],
)
def test_accepted_formats_and_modes_decode_to_rgb(fmt: str, mode: str) -> None:
    loaded = decode_image(encode(gradient(mode), fmt), max_pixels=MAX_PIXELS)
    assert loaded.pixels.mode == "RGB"
    assert (loaded.width, loaded.height) == (64, 48)
    assert loaded.source_format == fmt


def test_16_bit_png_keeps_its_tones_instead_of_clipping_to_white() -> None:
    wide = Image.fromarray(np.full((8, 8), 32768, dtype=np.uint16))  # mid grey in 16 bits
    loaded = decode_image(encode(wide, "PNG"), max_pixels=MAX_PIXELS)
    assert loaded.pixels.getpixel((0, 0)) == (128, 128, 128)


def test_transparent_palette_and_alpha_areas_become_white() -> None:
    rgba = Image.new("RGBA", (4, 4), (255, 0, 0, 0))
    assert decode_image(encode(rgba, "PNG"), max_pixels=MAX_PIXELS).pixels.getpixel((0, 0)) == (255, 255, 255)
    palette = Image.new("P", (4, 4), 0)
    palette.putpalette([0, 0, 255] * 256)
    data = encode(palette, "PNG", transparency=0)
    assert decode_image(data, max_pixels=MAX_PIXELS).pixels.getpixel((0, 0)) == (255, 255, 255)


def test_an_animated_gif_gives_its_first_frame() -> None:
    frames = [Image.new("RGB", (8, 8), color) for color in ((255, 0, 0), (0, 0, 255))]
    data = encode(frames[0], "GIF", save_all=True, append_images=frames[1:])
    assert decode_image(data, max_pixels=MAX_PIXELS).pixels.getpixel((0, 0)) == (255, 0, 0)


def test_exif_orientation_is_applied_so_sizes_are_as_a_viewer_shows_them() -> None:
    loaded = decode_image((SAMPLES / "chelsea-rotated-exif.jpg").read_bytes(), max_pixels=MAX_PIXELS)
    upright = decode_image((SAMPLES / "chelsea-the-cat.jpg").read_bytes(), max_pixels=MAX_PIXELS)
    assert (loaded.width, loaded.height) == (upright.width, upright.height) == (451, 300)
    difference = np.abs(np.asarray(loaded.pixels, float) - np.asarray(upright.pixels, float)).mean()
    assert difference < 5  # the same picture, up to JPEG noise


@pytest.mark.parametrize("fmt", ["HEIF", "AVIF"])
def test_a_phone_s_heic_or_avif_photo_decodes_upright_as_the_same_picture(fmt: str) -> None:
    # GIVEN the sideways-stored photo as an iPhone keeps it (HEIC), and as AVIF, each with its orientation
    data = phone_photo(SAMPLES / "chelsea-rotated-exif.jpg", fmt)
    # WHEN decoded
    loaded = decode_image(data, max_pixels=MAX_PIXELS)
    upright = decode_image((SAMPLES / "chelsea-the-cat.jpg").read_bytes(), max_pixels=MAX_PIXELS)
    # THEN it is the upright picture, as a viewer shows it
    assert loaded.source_format == fmt and (loaded.width, loaded.height) == (451, 300)
    difference = np.abs(np.asarray(loaded.pixels, float) - np.asarray(upright.pixels, float)).mean()
    assert difference < 8  # the same picture, up to two lossy encodings


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "file is empty"),
        (b"just some text, not pixels", "not an image"),
        ((SAMPLES / "chelsea-the-cat.jpg").read_bytes()[:3000], "truncated or corrupt JPEG"),
        (encode(gradient(), "PDF"), "not an image"),
    ],
    ids=["empty", "text", "truncated JPEG", "PDF"],  # not the bytes: a PDF's dates differ between xdist's workers
)
def test_bad_files_are_rejected_with_a_clear_reason(data: bytes, reason: str) -> None:
    with pytest.raises(ImageRejected, match=reason):
        decode_image(data, max_pixels=MAX_PIXELS)


def test_too_many_pixels_are_refused_from_the_header_before_decoding() -> None:
    data = encode(Image.new("1", (8000, 6000)), "PNG")  # 48 MP in a few kB
    with pytest.raises(ImageRejected, match="8000x6000 is 48,000,000 pixels, over the limit"):
        decode_image(data, max_pixels=MAX_PIXELS)


def test_a_decompression_bomb_is_refused() -> None:
    data = encode(Image.new("1", (20000, 10000)), "PNG")  # 200 MP: Pillow's own bomb guard fires first
    with pytest.raises(ImageRejected, match=r"decompression bomb|pixels, over the limit"):
        decode_image(data, max_pixels=250_000_000)


def test_files_over_the_byte_limit_are_refused_before_reading(tmp_path) -> None:
    big = tmp_path / "big.jpg"
    big.write_bytes(b"\xff" * 5000)
    settings = Settings(max_image_bytes=4000)
    with pytest.raises(ImageRejected, match="5,000 bytes, over the limit of 4,000"):
        load_image(str(big), store_for, settings.image_limits)


def test_a_missing_file_is_rejected_as_missing(tmp_path) -> None:
    with pytest.raises(ObjectMissing, match="does not exist") as raised:
        load_image(str(tmp_path / "nope.jpg"), store_for, Settings().image_limits)
    assert isinstance(raised.value, ImageRejected)  # every path that rejects an image rejects it too
