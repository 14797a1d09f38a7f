"""The API's one call (shared/serving/calls.py): the picture it answers with."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from shared.contracts import PictureFormat
from shared.serving.calls import fitted_picture
from shared.storage.render import encode_picture


@pytest.mark.parametrize("picture_format", [PictureFormat.JPEG, PictureFormat.PNG])
def test_the_picture_s_scale_is_over_the_image_s_width_whether_it_was_stored_smaller_or_fitted_here(
    picture_format: PictureFormat,
) -> None:
    # A picture stored at a quarter of its 400 px image (PictureMaxSide=100), within the bound: as it is, scale 0.25
    stored = encode_picture(Image.effect_noise((100, 50), 64).convert("RGB"), picture_format)
    assert fitted_picture(stored, len(stored), image_width=400) == (stored, 0.25, picture_format)
    # The same picture over the bound: downscaled further, in its own format, its scale still against the image's
    fitted, scale, fitted_format = fitted_picture(stored, len(stored) // 3, image_width=400)
    opened = Image.open(io.BytesIO(fitted))
    assert len(fitted) <= len(stored) // 3 and opened.width < 100 and scale == round(opened.width / 400, 4)
    assert fitted_format is picture_format and opened.format == picture_format.value.upper()
