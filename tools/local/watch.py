"""`annotate watch`: the latency dial on a laptop. Files dropped into a folder are gathered as the stack's Gather
function gathers S3 events, with the same rules (:func:`~shared.pipeline.gathering.gather_due`,
:func:`~shared.pipeline.batches.gathered_lane`), and each gathering runs as one batch on the local workflow."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from shared.pipeline.batches import LaneChoice, gathered_lane, image_ref
from shared.pipeline.gathering import gather_due
from shared.settings import IngestSettings
from shared.storage.objects import LocalStore, local_uri

# (the files, the lane chosen for them, why gathering was due)
RunGathered = Callable[[list[Path], LaneChoice, str], None]


def annotated_image_ids(data_dir: Path) -> set[str]:
    """The images the data folder has a row for: a watch started again does not annotate them twice."""
    from shared.storage import layout
    from tools.results.query import run_local_query

    if not (data_dir / layout.TABLES).is_dir():
        return set()
    return {row["image_id"] for row in run_local_query("SELECT DISTINCT image_id FROM images", data_dir).to_pylist()}


Stat = tuple[int, int]  # a file's size and modification time


@dataclass
class FolderDrops:
    """Files that appeared in a folder (hidden ones and the data folder aside), each counted as dropped once its size
    and time stop changing between two looks and it reads as a whole picture: a copy still being written, or one
    paused mid-way, is not a drop yet (until ``incomplete_wait_s`` passed, when it is annotated as it is and its row
    says why it failed). A drop is a file's content: the same name with new content is a new drop. ``done``: the
    images (by id: name and content) that already have a row, skipped."""

    folder: Path
    data_dir: Path
    done: set[str] = field(default_factory=set)
    max_pixels: int = 100_000_000
    incomplete_wait_s: float = 60.0
    _seen: dict[Path, Stat] = field(default_factory=dict)
    _content: dict[tuple[Path, Stat], str] = field(default_factory=dict)  # what each file held at each look
    _incomplete_since: dict[tuple[Path, Stat], float] = field(default_factory=dict)
    _gathered: set[tuple[Path, str]] = field(default_factory=set)  # (file, its content's fingerprint)

    def _files(self) -> dict[Path, Stat]:
        data_dir = self.data_dir.resolve()
        files = {}
        for path in self.folder.rglob("*"):
            hidden = any(part.startswith(".") for part in path.relative_to(self.folder).parts)
            if hidden or not path.is_file() or path.resolve().is_relative_to(data_dir):
                continue
            try:
                stat = path.stat()
            except FileNotFoundError:  # moved away between the listing and now: not a drop
                continue
            files[path] = (stat.st_size, stat.st_mtime_ns)
        return files

    def _fingerprint(self, path: Path, stat: Stat) -> str:
        if (path, stat) not in self._content:
            self._content[(path, stat)] = LocalStore().fingerprint(local_uri(path.resolve()))
        return self._content[(path, stat)]

    def _pending(self, path: Path, stat: Stat) -> bool:
        """Whether a drop is not gathered yet (nor annotated by an earlier watch)."""
        fingerprint = self._fingerprint(path, stat)
        if (path, fingerprint) in self._gathered:
            return False
        if image_ref(local_uri(path.resolve()), fingerprint).image_id in self.done:
            self._gathered.add((path, fingerprint))
            return False
        return True

    def _whole(self, path: Path, stat: Stat) -> bool:
        """Whether the file reads as a whole picture, or has waited long enough to be taken as it is."""
        from shared.errors import ImageRejected
        from shared.storage.images import decode_image

        if (path, stat) not in self._incomplete_since:
            try:
                decode_image(path.read_bytes(), max_pixels=self.max_pixels)
                return True
            except ImageRejected as error:
                if not str(error).startswith("truncated"):
                    return True  # not a picture, or too large: its row says so
            except OSError:
                return False
            self._incomplete_since[(path, stat)] = time.monotonic()
        return time.monotonic() - self._incomplete_since[(path, stat)] >= self.incomplete_wait_s

    def look(self) -> list[Path]:
        """The files dropped and not gathered yet."""
        files = self._files()
        settled = sorted(path for path, stat in files.items() if self._seen.get(path) == stat)
        self._seen = files
        for looked in (self._content, self._incomplete_since):  # what files held before: read no more
            for key in [key for key in looked if files.get(key[0]) != key[1]]:
                del looked[key]
        return [path for path in settled if self._pending(path, files[path]) and self._whole(path, files[path])]

    def gathered(self, paths: list[Path]) -> None:
        """``paths`` started, as they were when last looked at."""
        self._gathered.update((path, self._fingerprint(path, self._seen[path])) for path in paths if path in self._seen)

    def not_gathered(self) -> list[Path]:
        """Every file there not gathered yet, settled or not: what a watch that ends runs last."""
        files = self._files()
        self._seen = files
        return sorted(path for path, stat in files.items() if self._pending(path, stat))


def watch_folder(
    drops: FolderDrops,
    settings: IngestSettings,
    wait_s: float,
    run_gathered: RunGathered,
    stopping: threading.Event,
    look_every_s: float = 1.0,
    until: datetime | None = None,
) -> list[Path]:
    """Look every ``look_every_s`` until ``stopping`` is set (or ``until``); whenever gathering is due, run what was
    dropped as one batch, in the lane the stack's rule picks. Returns what was dropped but not started (stopped: the
    next watch gathers it)."""
    last: datetime | None = None
    waiting: list[Path] = []
    while not stopping.is_set() and (until is None or datetime.now(UTC) < until):
        waiting = drops.look()
        now = datetime.now(UTC)
        due = gather_due(now, last, len(waiting), settings, wait_s, look_every_s)
        if due:
            last = now
            if waiting:
                run_gathered(waiting, gathered_lane(len(waiting), settings, wait_s), due)
                drops.gathered(waiting)
                waiting = []
        stopping.wait(look_every_s)
    return waiting
