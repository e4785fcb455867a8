"""A vision-language run's images in `quartet inspect`: the sample names them, the server sends each with its
content type, and nothing but a file in the run's own `rollouts/images/` (by the name a record gives) is
reachable: `..`, absolute paths, other folders and symlinks out of it are refused."""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from vision_run import BLUE, RED, picture, write_run

from quartet.inspector.run_data import RunData
from quartet.inspector.server import InspectServer

SECRET = picture((1, 2, 3))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(url, run folder): run 0 holds images and a symlink out; run 1's images folder IS a symlink out."""
    root = tmp_path_factory.mktemp("vision_runs")
    run = root / "run"
    write_run(run, [[RED], [RED, BLUE], []])
    outside = root / "outside"
    outside.mkdir()
    secret = outside / f"{hashlib.sha256(SECRET).hexdigest()}.png"
    secret.write_bytes(SECRET)
    (run / "rollouts" / "images" / secret.name).symlink_to(secret)
    other = root / "other"
    write_run(other, [[RED]])
    for file in (other / "rollouts" / "images").iterdir():
        file.unlink()
    (other / "rollouts" / "images").rmdir()
    (other / "rollouts" / "images").symlink_to(outside, target_is_directory=True)
    with InspectServer([run, other]) as url:
        yield url, run


def _get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as res:
            return res.status, res.headers.get_content_type(), res.read()
    except urllib.error.HTTPError as err:
        return err.code, "", err.read()


def _image(url: str, path: str, run: int = 0) -> tuple[int, str, bytes]:
    return _get(f"{url}/api/run/{run}/image?{urllib.parse.urlencode({'path': path})}")


def test_the_sample_names_its_images_and_the_server_sends_them(served: tuple[str, Path]) -> None:
    url, _ = served
    red = f"rollouts/images/{hashlib.sha256(RED).hexdigest()}.png"
    blue = f"rollouts/images/{hashlib.sha256(BLUE).hexdigest()}.jpg"
    status, _, body = _get(f"{url}/api/run/0/step/1/sample/1")
    sample: dict[str, Any] = json.loads(body)
    assert status == 200 and sample["images"] == [red, blue]
    assert json.loads(_get(f"{url}/api/run/0/step/1/sample/2")[2])["images"] == []
    assert _image(url, red) == (200, "image/png", RED)
    assert _image(url, blue) == (200, "image/jpeg", BLUE)


@pytest.mark.parametrize(
    "path",
    [
        "",
        "rollouts/images/../../metrics.jsonl",
        "rollouts/images/../step_1.parquet",
        "/etc/passwd",
        "rollouts/step_1.parquet",
        "rollouts//images/" + "0" * 64 + ".png",
        "./rollouts/images/" + "0" * 64 + ".png",
        "rollouts/images/" + "A" * 64 + ".png",
        "rollouts/images/" + "0" * 64 + ".svg",
        "rollouts/images/" + "0" * 64 + ".png\n",
        "rollouts\\images\\" + "0" * 64 + ".png",
    ],
)
def test_a_path_of_another_form_is_400(served: tuple[str, Path], path: str) -> None:
    status, _, body = _image(served[0], path)
    assert status == 400 and b"path" in body


def test_an_absolute_path_to_a_real_image_is_400(served: tuple[str, Path]) -> None:
    url, run = served
    real = next((run / "rollouts" / "images").glob("*.jpg"))
    assert _image(url, str(real))[0] == 400
    assert _image(url, "%2e%2e/" + real.name)[0] == 400


def test_missing_files_and_symlinks_out_of_the_folder_are_404(served: tuple[str, Path]) -> None:
    url, _ = served
    secret = f"rollouts/images/{hashlib.sha256(SECRET).hexdigest()}.png"
    assert _image(url, "rollouts/images/" + "0" * 64 + ".png")[0] == 404
    assert _image(url, secret)[0] == 404  # a link in the folder to a file outside it
    assert _image(url, secret, run=1)[0] == 404  # the images folder itself links out of the run
    assert _get(f"{url}/api/run/7/image?path={secret}")[0] == 404


def test_run_data_resolves_within_the_folder(served: tuple[str, Path]) -> None:
    _, run = served
    name = f"{hashlib.sha256(RED).hexdigest()}.png"
    file, kind = RunData(run).image_file(f"rollouts/images/{name}")
    assert file == (run / "rollouts" / "images" / name).resolve() and kind == "image/png"
    with pytest.raises(ValueError, match="rollouts/images/<sha256>"):
        RunData(run).image_file("../x.png")
