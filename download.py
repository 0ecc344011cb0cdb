"""download.py — resumable HTTP downloads and the Hugging Face Hub's file listing, for data.py's FineWeb shards and
core_bundle.py's CORE bundle.

A download streams into <dest>.part, resumes with an HTTP Range request after a cut connection (retrying with backoff),
and appears under <dest> only once its size and sha256 (where known) match. The Hub endpoint comes from $HF_ENDPOINT
(a mirror), its login from $HF_TOKEN.
"""
import os
import sys
import time

import requests

from cli import UsageError, sha256_file

HF_ENDPOINT = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
# A cut connection loses less than one chunk of what was received.
DOWNLOAD = dict(retries=8, backoff_s=2.0, max_backoff_s=60.0, timeout_s=60, chunk_bytes=1 << 16)


class DownloadError(UsageError):
    """A listing or download that failed or does not match; the message is one line that says what to do."""


def hf_auth_headers():
    """The Hub's login ($HF_TOKEN), if one is set."""
    token = os.environ.get("HF_TOKEN")
    return {"Authorization": f"Bearer {token}"} if token else {}


def hf_list(repo, revision, path):
    """Files directly under `path` of a dataset repo at `revision`: sorted [{path, size, sha256}]."""
    url = f"{HF_ENDPOINT}/api/datasets/{repo}/tree/{revision}/{path}"
    entries = []
    while url:
        try:
            r = requests.get(url, headers=hf_auth_headers(), timeout=DOWNLOAD["timeout_s"])
            r.raise_for_status()
        except requests.RequestException as e:
            raise DownloadError(f"cannot list {repo}@{revision}/{path}: {e}") from None
        entries += r.json()
        url = r.links.get("next", {}).get("url")  # the Hub paginates large folders with a Link header
    files = [dict(path=e["path"], size=e.get("size"), sha256=(e.get("lfs") or {}).get("oid"))
             for e in entries if e.get("type") == "file" and e["path"].endswith(".parquet")]
    if not files:
        raise DownloadError(f"no parquet files under {repo}@{revision}/{path}")
    return sorted(files, key=lambda f: f["path"])


def hf_url(repo, revision, path):
    return f"{HF_ENDPOINT}/datasets/{repo}/resolve/{revision}/{path}"


def _progress(name, done, total, start_bytes, t0):
    rate = (done - start_bytes) / max(time.time() - t0, 1e-9)
    eta = f"{(total - done) / rate:.0f}s" if total and rate > 0 else "?"
    of = f"/{total / 1e6:.1f}" if total else ""
    print(f"\r  {name}: {done / 1e6:.1f}{of} MB  {rate / 1e6:.1f} MB/s  ETA {eta}   ", end="", file=sys.stderr,
          flush=True)


def download(url, dest, expected_size=None, expected_sha256=None, headers=None):
    """Stream `url` to dest + ".part", resuming with HTTP Range and retrying with backoff; the file appears
    under `dest` only when its size (announced by the server and the listing) and sha256 (if known) match.
    headers: extra request headers (the Hub's login)."""
    part = dest + ".part"
    name = os.path.basename(dest)
    last_error = None
    for attempt in range(DOWNLOAD["retries"]):
        if attempt:
            time.sleep(min(DOWNLOAD["backoff_s"] * 2 ** (attempt - 1), DOWNLOAD["max_backoff_s"]))
        have = os.path.getsize(part) if os.path.exists(part) else 0
        request_headers = dict(headers or {}, **({"Range": f"bytes={have}-"} if have else {}))
        try:
            with requests.get(url, headers=request_headers, stream=True, timeout=DOWNLOAD["timeout_s"]) as r:
                if r.status_code == 416 and have:  # nothing left to send: the .part may already be whole
                    total = r.headers.get("Content-Range", "*/*").rsplit("/", 1)[1]
                    total = int(total) if total.isdigit() else None
                elif r.status_code in (401, 403, 404):
                    raise DownloadError(f"{url} answered HTTP {r.status_code}"
                                    + ("; set HF_TOKEN if the dataset needs a login"
                                       if headers is not None and r.status_code != 404 else ""))
                else:
                    r.raise_for_status()
                    if r.status_code == 206:
                        first, total = r.headers["Content-Range"].split(" ")[1].split("/")
                        if int(first.split("-")[0]) != have:
                            raise DownloadError(f"{url}: server resumed at the wrong offset ({first}, wanted {have})")
                        total = int(total)
                    else:  # a plain 200 restarts from byte 0
                        have, total = 0, int(r.headers["Content-Length"]) if "Content-Length" in r.headers else None
                    if expected_size is not None and total is not None and total != expected_size:
                        raise DownloadError(f"size mismatch for {url}: server announces {total} bytes, the listing "
                                        f"says {expected_size}; delete {part} and retry, or check the revision")
                    t0, start, shown = time.time(), have, 0.0
                    with open(part, "ab" if have else "wb") as f:
                        for chunk in r.iter_content(DOWNLOAD["chunk_bytes"]):
                            f.write(chunk)
                            have += len(chunk)
                            if time.time() - shown > 1.0 or have == total:
                                _progress(name, have, total, start, t0)
                                shown = time.time()
                    print(file=sys.stderr)
        except requests.RequestException as e:  # cut connections, timeouts, 5xx: resume on the next attempt
            last_error = f"{type(e).__name__}: {e}"
            continue
        size = os.path.getsize(part)
        want = expected_size if expected_size is not None else total
        if want is not None and size < want:
            last_error = f"got {size} of {want} bytes"
            continue
        if want is not None and size > want:
            os.remove(part)
            raise DownloadError(f"size mismatch for {url}: received {size} bytes, expected {want}")
        if expected_sha256 and sha256_file(part) != expected_sha256:
            os.remove(part)
            raise DownloadError(f"sha256 mismatch for {url}; the partial file was removed, re-run to download again")
        os.replace(part, dest)
        return dest
    raise DownloadError(f"download of {url} failed after {DOWNLOAD['retries']} attempts ({last_error}); "
                    f"re-run to resume from {part}")
