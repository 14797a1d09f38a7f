"""What the Lambda packages leave out must not be needed: a pruned pyarrow still writes the tables."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow

from tests.conftest import REPO

WRITE_AND_READ = """
import sys
from datetime import UTC, datetime
import pyarrow, pyarrow.parquet as pq
assert pyarrow.__file__.startswith(sys.argv[1]), pyarrow.__file__
from shared.contracts import ImageResult, Status
from shared.storage import store_for
from shared.tables import write_table_files
result = ImageResult(image_id="a" * 16, source_uri="x.jpg", batch_id="b-" + "0" * 20, status=Status.SUCCEEDED,
                     prompt="dog.", processed_at=datetime.now(UTC))
uris = write_table_files([result], sys.argv[2], result.batch_id, datetime.now(UTC), store_for)
print(pq.read_table(uris["images"]).num_rows)
"""


def test_the_pruned_pyarrow_of_the_arrow_layer_writes_and_reads_the_tables(tmp_path: Path) -> None:
    site = tmp_path / "python"
    shutil.copytree(Path(pyarrow.__file__).parent, site / "pyarrow")
    subprocess.run([str(REPO / "layers" / "arrow" / "prune.sh"), str(site)], check=True)
    assert not list((site / "pyarrow").glob("libarrow_flight*"))

    result = subprocess.run(
        [sys.executable, "-c", WRITE_AND_READ, str(site), str(tmp_path / "results")],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO}"},
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1"
