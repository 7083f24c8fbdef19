"""docs/remote.md, "A first try on a local S3 server": the bucket is made as shown, and the variables and
options the section names are all a local server needs (a copy there and ``info`` of it, both by CLI)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import seqstore as ss
from seqstore import cli

REPO = Path(__file__).resolve().parents[1]


def _section() -> str:
    text = (REPO / "docs" / "remote.md").read_text()
    start = text.find("**A first try on a local S3 server.**")
    assert start >= 0, "docs/remote.md has no section on a first try with a local S3 server"
    end = text.find("\n**", start + 10)
    return text[start : end if end > 0 else len(text)]


def test_section_names_bucket_creation_and_variables() -> None:
    sec = _section()
    for needed in ("create_bucket", "s3 mb", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION",
                   "endpoint", "allow_http"):
        assert needed in sec, needed


def test_the_documented_setup_works(tmp_path: Path, moto_s3, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    import boto3

    for k in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(k)
    bucket = f"first-try-{tmp_path.name[-8:].lower().replace('_', '-')}"
    s3 = boto3.client("s3", endpoint_url=moto_s3.endpoint, region_name="us-east-1",
                      aws_access_key_id="test", aws_secret_access_key="test")
    s3.create_bucket(Bucket=bucket)
    with ss.create(tmp_path / "train.seqstore", {"x": ss.Field("float32", (None,))}) as w:
        for i in range(5):
            w.append({"x": np.arange(i, dtype=np.float32)})
    for k, v in (("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test"), ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(k, v)
    url = f"s3://{bucket}/corpora/train.seqstore"
    ep = f"endpoint={moto_s3.endpoint}"
    assert cli.main(["copy", str(tmp_path / "train.seqstore"), url, "--dst-option", ep,
                     "--dst-option", "allow_http=true", "-q"]) == 0
    assert cli.main(["info", url, "-o", ep, "-o", "allow_http=true", "-q"]) == 0
    store = ss.open(url, storage_options={"endpoint": moto_s3.endpoint, "allow_http": "true"})
    assert len(store) == 5 and store[4]["x"].tolist() == [0, 1, 2, 3]
