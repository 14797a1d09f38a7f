"""One static page of the annotated pictures: captions, labels, classes and attributes, failures with their reasons,
filterable by label. No server: open ``index.html``. Each picture is drawn now from the image's result document and
its source, into a folder beside the page; a picture the pipeline stored (``store_pictures``) is copied there, or from
S3 given as a presigned URL that expires."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from jinja2 import Environment

from shared.contracts import ImageResult, PictureFormat
from shared.errors import ImageRejected
from shared.settings import ImageLimits
from shared.storage.objects import StoreFor, is_s3
from shared.storage.render import result_picture
from tools.results.annotations import AnnotatedImage

PICTURES_FOLDER = "pictures"
# uri -> a URL a browser can open for an hour or so (S3 presigned), given by the caller in AWS mode.
Presign = Callable[[str], str]

_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>annotate: {{ images | length }} images</title>
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 1rem; background: #f6f6f6; color: #222; }
  header { display: flex; flex-wrap: wrap; gap: .5rem; align-items: center; margin-bottom: 1rem; }
  header h1 { font-size: 1.2rem; margin: 0 1rem 0 0; }
  .filter { border: 1px solid #888; border-radius: 1rem; padding: .2rem .7rem; background: #fff; cursor: pointer; }
  .filter[aria-pressed="true"] { background: #224; color: #fff; }
  main { display: grid; grid-template-columns: repeat(auto-fill, minmax(300px, 1fr)); gap: 1rem; }
  .card { background: #fff; border-radius: .4rem; padding: .6rem; box-shadow: 0 1px 3px #0002; }
  .card img { width: 100%; height: auto; border-radius: .2rem; }
  .card.failed { border-left: .3rem solid #c33; }
  .source { font-weight: 600; overflow-wrap: anywhere; }
  .reason { color: #a22; }
  .box { display: inline-block; background: #eef; border-radius: .3rem; padding: 0 .3rem; margin: .1rem; }
  [hidden] { display: none !important; }
</style>
</head>
<body>
<header>
  <h1>{{ images | length }} images, {{ failed }} failed</h1>
  <button class="filter" type="button" data-label="" aria-pressed="true">all</button>
  {% for label in labels %}<button class="filter" type="button" data-label="{{ label }}" aria-pressed="false">
    {{ label }}</button>{% endfor %}
  <button class="filter" type="button" data-failed="true" aria-pressed="false">failed</button>
</header>
<main>
{% for card in cards %}
  <article class="card{% if card.image.status != 'succeeded' %} failed{% endif %}"
    data-labels="{{ card.image.labels | tojson | forceescape }}" data-status="{{ card.image.status }}">
    {% if card.picture %}<img src="{{ card.picture }}" alt="{{ card.name }} with its boxes" loading="lazy">{% endif %}
    <div class="source" title="{{ card.image.source_uri }}">{{ card.name }}</div>
    {% if card.image.caption %}<p class="caption">{{ card.image.caption }}</p>{% endif %}
    {% if card.image.status != 'succeeded' %}
    <p class="reason">{{ card.image.error or card.image.status }}</p>{% endif %}
    <div>{% for box in card.image.boxes %}<span class="box">{{ box.label }} {{ '%.2f' | format(box.score) }}
      {%- if box.class_label %} · {{ box.class_label }}{% endif %}
      {%- for value in box.attributes.values() %} · {{ value }}{% endfor %}</span>{% endfor %}</div>
  </article>
{% endfor %}
</main>
<script>
  const buttons = document.querySelectorAll(".filter");
  for (const button of buttons) {
    button.addEventListener("click", () => {
      for (const other of buttons) other.setAttribute("aria-pressed", String(other === button));
      const label = button.dataset.label;
      for (const card of document.querySelectorAll(".card")) {
        const shown = button.dataset.failed ? card.dataset.status !== "succeeded"
          : label === "" || JSON.parse(card.dataset.labels).includes(label);
        card.hidden = !shown;
      }
    });
  }
</script>
</body>
</html>
"""


def write_gallery(
    images: list[AnnotatedImage], out_dir: Path, store_for: StoreFor, presign: Presign | None = None
) -> Path:
    """``out_dir/index.html`` with one card per image; returns its path.

    A picture that cannot be read any more leaves its card without one; the card still says what was found.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    cards = [
        {
            "image": image,
            "name": image.source_uri.rsplit("/", 1)[-1],
            "picture": _picture(image, out_dir, store_for, presign),
        }
        for image in images
    ]
    page = (
        Environment(autoescape=True)
        .from_string(_PAGE)
        .render(
            images=images,
            cards=cards,
            labels=sorted({label for image in images for label in image.labels}),
            failed=sum(image.status != "succeeded" for image in images),
        )
    )
    index = out_dir / "index.html"
    index.write_text(page, encoding="utf-8")
    return index


def _picture(image: AnnotatedImage, out_dir: Path, store_for: StoreFor, presign: Presign | None) -> str | None:
    uri = image.annotated_uri
    if uri and is_s3(uri) and presign is not None:
        return presign(uri)
    if image.width is None or not (uri or image.result_uri):  # never detected: nothing to draw over
        return None
    try:
        if uri:
            data, picture_format = store_for(uri).read_bytes(uri), PictureFormat.of_uri(uri)
        else:
            document = store_for(image.result_uri).read_bytes(image.result_uri)  # type: ignore[arg-type]
            data, picture_format = result_picture(ImageResult.model_validate_json(document), store_for, ImageLimits())
    except (ImageRejected, ValueError):  # gone, or no longer an image or a document
        return None
    folder = out_dir / PICTURES_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    name = image.image_id + picture_format.suffix
    (folder / name).write_bytes(data)
    return f"{PICTURES_FOLDER}/{name}"
