"""The agent's image cache, fetching over HTTP as it does from keel-api."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.compute.image_cache import ImageCache
from shared.exceptions import BuildFailed
from tests.libvirt.images import Served, serve

pytestmark = pytest.mark.functional


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    root = tmp_path / "served"
    root.mkdir()
    for name, size in (("one", 300_000), ("two", 200_000), ("three", 200_000)):
        (root / name).write_bytes(os.urandom(size))
    with serve(root) as running:
        yield running


async def test_an_image_is_fetched_once_and_verified_each_time(
    served: Served, tmp_path: Path
) -> None:
    cache = ImageCache(tmp_path / "cache", cap_bytes=10**6)
    image = served.image_file("one")

    first, second = await asyncio.gather(cache.fetch(image), cache.fetch(image))
    again = await cache.fetch(image)

    assert first == second == again
    assert again.read_bytes() == (served.root / "one").read_bytes()
    assert served.requests == ["/one"]


async def test_a_damaged_cached_image_is_discarded_and_fetched_again(
    served: Served, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = ImageCache(tmp_path / "cache", cap_bytes=10**6)
    image = served.image_file("one")
    path = await cache.fetch(image)
    with path.open("r+b") as damaged:
        damaged.seek(1000)
        damaged.write(b"rot")

    fetched = await cache.fetch(image)

    assert fetched.read_bytes() == (served.root / "one").read_bytes()
    assert served.requests == ["/one", "/one"]
    assert "no longer matches its record" in caplog.text


async def test_data_that_does_not_match_its_record_is_never_kept(
    served: Served, tmp_path: Path
) -> None:
    cache = ImageCache(tmp_path / "cache", cap_bytes=10**6)
    image = served.image_file("one").model_copy(update={"os_hash_value": "0" * 128})

    with pytest.raises(BuildFailed, match="does not match its record"):
        await cache.fetch(image)

    assert list((tmp_path / "cache").iterdir()) == []


async def test_a_refused_url_is_a_build_failure(served: Served, tmp_path: Path) -> None:
    cache = ImageCache(tmp_path / "cache", cap_bytes=10**6)
    image = served.image_file("one").model_copy(update={"url": f"{served.base_url}/nope"})

    with pytest.raises(BuildFailed, match=r"refused the download .* 403"):
        await cache.fetch(image)


async def test_the_least_recently_used_images_go_past_the_cap(
    served: Served, tmp_path: Path
) -> None:
    cache = ImageCache(tmp_path / "cache", cap_bytes=550_000)
    one, two, three = (served.image_file(name) for name in ("one", "two", "three"))
    await cache.fetch(one)
    await cache.fetch(two)
    os.utime(cache.path(one.id), (1, 1))  # used long ago
    os.utime(cache.path(two.id), (2, 2))

    await cache.fetch(three)

    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted(
        [str(two.id), str(three.id)]
    )
