"""What the commands say to inputs a user may well give: one line and exit 2 for a mistake, output that fits the
terminal, and figures found wherever the command is run."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tools.cli import app


def annotate(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "100"})
    return result.exit_code, result.output


def test_a_wide_query_result_fits_the_terminal_and_says_where_the_whole_values_are(tmp_path: Path) -> None:
    code, output = annotate(
        "query", "SELECT repeat('word ', 60) AS caption, 1 AS n, 'a' AS x, 'b' AS y", "--data-dir", str(tmp_path)
    )
    assert code == 0 and max(len(line) for line in output.splitlines()) <= 100, output
    assert "1 row; cells cut to fit: --format csv or json gives them whole" in output
    code, output = annotate("query", "SELECT 1 AS n", "--data-dir", str(tmp_path))
    assert code == 0 and output.rstrip().endswith("1 row"), output


def test_make_demo_s_table_at_80_columns_keeps_status_and_boxes_whole_and_shows_paths_by_their_names(
    tmp_path: Path,
) -> None:
    # GIVEN the demo's query over rows whose sources are long paths and whose captions are long
    source = "/home/someone/projects/annotate/samples/" + "a-long-folder-name/" * 3 + "chelsea-the-cat.jpg"
    sql = (
        f"SELECT '{source}' AS source_uri, 'succeeded' AS status, 12 AS boxes, "
        "'A cat sits on a sofa beside a cup of coffee, in the light of a window on a winter morning' AS caption"
    )
    # WHEN printed on a terminal of 80 columns
    result = CliRunner().invoke(app, ["query", sql, "--data-dir", str(tmp_path)], env={"COLUMNS": "80"})
    # THEN the short cells are whole, the path is its file name, and every line fits
    [row] = [line for line in result.output.splitlines() if "succeeded" in line]
    assert "…/chelsea-the-cat.jpg" in row and "│ 12 " in row, result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80, result.output


def test_export_into_a_folder_that_holds_other_files_is_refused_without_walking_it(results_with_rows: Path) -> None:
    code, output = annotate("export", "--format", "coco", "--out", "/", "--data-dir", str(results_with_rows))
    assert code == 2 and "--out / already holds files annotate export did not write" in output, output
    assert output.count("\n") == 1, output


@pytest.mark.parametrize(
    ("bench", "said"),
    [("/dev/zero", "is not a bench report"), ("/nowhere/bench.json", "run annotate bench to measure one")],
)
def test_cost_says_what_is_wrong_with_its_bench_report_in_one_line(bench: str, said: str, tmp_path: Path) -> None:
    code, output = annotate("cost", "--bench", bench, "--out-dir", str(tmp_path))
    assert code == 2 and said in output and output.count("\n") == 1, output


def test_cost_prices_from_the_checkout_s_bench_wherever_it_is_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, output = annotate("cost", "--out-dir", str(tmp_path / "out"))
    assert code == 0, output
    # the table prices each scenario's options from the checkout's bench, a dollar figure in every row
    table = (tmp_path / "out" / "cost.md").read_text()
    rows = [line for line in table.split("\n\n")[0].splitlines() if line.startswith("| steady: ")]
    assert len(rows) >= 4 and all("$" in row.split("|")[3] for row in rows), table[:2000]
    assert "\nSeconds: " in table  # where the seconds priced come from


@pytest.mark.parametrize(
    ("truth", "said"), [("/dev/zero", "/dev/zero: not a regular file"), ("/nowhere/truth.json", "no such file")]
)
def test_evaluate_says_what_is_wrong_with_its_truth_in_one_line(truth: str, said: str, tmp_path: Path) -> None:
    code, output = annotate("evaluate", "--truth", truth, "--data-dir", str(tmp_path))
    assert code == 2 and output.count("\n") == 1 and said in output, output


@pytest.mark.parametrize(
    ("config", "said"),
    [("/nowhere/config.xml", "no such file"), ("/dev/zero", "not a regular file"), ("<View", "not XML")],
)
def test_a_label_config_that_cannot_be_read_is_said_in_one_line(
    config: str, said: str, tmp_path: Path, results_with_rows: Path
) -> None:
    if config.startswith("<"):
        (tmp_path / "config.xml").write_text(config)
        config = str(tmp_path / "config.xml")
    code, output = annotate(
        "export",
        "--format",
        "labelstudio",
        "--out",
        str(tmp_path / "ls"),
        "--data-dir",
        str(results_with_rows),
        "--label-config",
        config,
    )
    assert code == 2 and said in output and output.count("\n") == 1, output
    assert not (tmp_path / "ls").exists()


def test_bench_photo_says_in_one_line_that_a_sample_is_no_image(tmp_path: Path) -> None:
    notes = tmp_path / "notes.jpg"
    notes.write_text("not a photo")
    code, output = annotate("bench-photo", str(notes), "--out-dir", str(tmp_path / "out"))
    assert code == 2 and "notes.jpg is not an image Pillow reads" in output and output.count("\n") == 1, output
    assert not (tmp_path / "out").exists()


def test_sam_build_finds_python_3_12_where_this_machine_has_it_or_says_how_to_get_it(tmp_path: Path) -> None:
    import os
    import shutil
    import subprocess
    import sys

    script = str(Path(__file__).resolve().parents[2] / "scripts" / "sam_build.sh")
    # GIVEN a PATH whose only python3.12 is a 3.11 in disguise, and no pyenv or uv
    (tmp_path / "python3.12").symlink_to(sys.executable)
    bare = {"PATH": f"{tmp_path}:/usr/bin:/bin", "HOME": str(tmp_path)}
    found = subprocess.run(["bash", script, "--which-python"], env=bare, capture_output=True, text=True, timeout=60)
    # THEN it is not taken for Lambda's runtime, and the message says how to install one
    assert found.returncode == 1 and "install it (pyenv install 3.12" in found.stderr
    # AND with this machine's own PATH it finds a real 3.12 if there is one
    found = subprocess.run(["bash", script, "--which-python"], env=os.environ, capture_output=True, text=True)
    if shutil.which("python3.12") or shutil.which("pyenv") or shutil.which("uv"):
        interpreter = found.stdout.strip()
        version = subprocess.run([interpreter, "-V"], capture_output=True, text=True).stdout
        assert found.returncode == 0 and version.startswith("Python 3.12"), found.stderr
