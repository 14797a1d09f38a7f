"""The API's one call (shared/serving/calls.py): the picture it answers with."""

from __future__ import annotations

import io

from PIL import Image

from shared.serving.calls import fitted_png


def png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.effect_noise((width, height), 64).convert("RGB").save(buffer, format="PNG")
    return buffer.getvalue()


def test_the_picture_s_scale_is_over_the_image_s_width_whether_it_was_stored_smaller_or_fitted_here() -> None:
    # A picture stored at a quarter of its 400 px image (PictureMaxSide=100), within the bound: as it is, scale 0.25
    stored = png(100, 50)
    assert fitted_png(stored, len(stored), image_width=400) == (stored, 0.25)
    # The same picture over the bound: downscaled further, its scale still against the image's 400 px
    fitted, scale = fitted_png(stored, len(stored) // 3, image_width=400)
    width = Image.open(io.BytesIO(fitted)).width
    assert len(fitted) <= len(stored) // 3 and width < 100 and scale == round(width / 400, 4)
