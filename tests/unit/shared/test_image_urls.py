"""Signed image download URLs: valid for one image, for a while, under one secret."""

from __future__ import annotations

import uuid
from urllib.parse import parse_qs, urlsplit

from shared import image_urls

SECRET = "a-secret-of-at-least-16-chars"


def _query(url: str) -> tuple[str, str]:
    query = parse_qs(urlsplit(url).query)
    return query["expires"][0], query["signature"][0]


def test_a_signed_url_is_valid_until_it_expires() -> None:
    image = uuid.uuid4()
    url = image_urls.signed_url("http://api:8774/", SECRET, image, 60, now=1000.0)
    expires, signature = _query(url)

    assert url.startswith(f"http://api:8774/image/download/{image}?")
    assert image_urls.refusal(SECRET, image, expires, signature, now=1059.0) is None
    assert image_urls.refusal(SECRET, image, expires, signature, now=1061.0) == (
        "the URL has expired"
    )


def test_another_image_secret_or_expiry_is_refused() -> None:
    image = uuid.uuid4()
    expires, signature = _query(image_urls.signed_url("http://a", SECRET, image, 60, now=0.0))

    assert "does not match" in str(image_urls.refusal(SECRET, uuid.uuid4(), expires, signature))
    assert "does not match" in str(
        image_urls.refusal("another-secret-0123456", image, expires, signature)
    )
    assert "does not match" in str(
        image_urls.refusal(SECRET, image, str(int(expires) + 1), signature)
    )
    assert "no expiry" in str(image_urls.refusal(SECRET, image, None, signature))
    assert "not enabled" in str(image_urls.refusal(None, image, expires, signature))
