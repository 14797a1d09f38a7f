"""`annotate watch`: the latency dial on a laptop. Files dropped into a folder are gathered as the stack's Gather
function gathers S3 events, with the same rules (:func:`~shared.pipeline.gathering.gather_due`,
:func:`~shared.pipeline.batches.gathered_lane`), and each gathering runs as one batch on the local workflow."""

from __future__ import annotations

import threading
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
    from shared.storage.tables import TABLES_PREFIX
    from tools.results.query import run_local_query

    if not (data_dir / TABLES_PREFIX).is_dir():
        return set()
    return {row["image_id"] for row in run_local_query("SELECT DISTINCT image_id FROM images", data_dir).to_pylist()}


@dataclass
class FolderDrops:
    """Files that appeared in a folder (hidden ones and the data folder aside), each counted as dropped once its size
    and time stop changing between two looks: a copy still being written is not a drop yet. ``done``: the images
    (by id: name and content) that already have a row, skipped."""

    folder: Path
    data_dir: Path
    done: set[str] = field(default_factory=set)
    _seen: dict[Path, tuple[int, int]] = field(default_factory=dict)
    _gathered: set[Path] = field(default_factory=set)

    def _annotated_before(self, path: Path) -> bool:
        uri = local_uri(path.resolve())
        return image_ref(uri, LocalStore().fingerprint(uri)).image_id in self.done

    def _files(self) -> dict[Path, tuple[int, int]]:
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

    def look(self) -> list[Path]:
        """The files dropped and not gathered yet."""
        files = self._files()
        dropped = sorted(path for path, stat in files.items() if self._seen.get(path) == stat)
        self._seen = files
        new = [path for path in dropped if path not in self._gathered]
        if self.done:
            self.gathered([path for path in new if self._annotated_before(path)])
        return [path for path in new if path not in self._gathered]

    def gathered(self, paths: list[Path]) -> None:
        self._gathered.update(paths)

    def not_gathered(self) -> list[Path]:
        """Every file there not gathered yet, settled or not: what a watch that ends runs last."""
        left = [path for path in self._files() if path not in self._gathered]
        return sorted(path for path in left if not (self.done and self._annotated_before(path)))


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
