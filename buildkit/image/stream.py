"""``docker save`` as a stream that can be stopped: the archive's chunks, and a reader that lets
tarfile's stream mode take them without copying any chunk twice."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from urllib.parse import quote

import docker

CHUNK = 1 << 20


@contextlib.contextmanager
def saved(client: docker.APIClient, image: str, chunk_size: int = CHUNK) -> Iterator[Iterator[bytes]]:
    """The chunks of ``docker save IMAGE``; the answer is closed on leaving, read to its end or not
    (docker-py's ``get_image`` leaves an abandoned answer open; the engine stops writing when it is
    closed)."""
    response = client.get(f"{client.base_url}/v{client.api_version}/images/{quote(image, safe='')}/get", stream=True)
    try:
        if response.status_code != 200:
            said = response.text.strip()
            with contextlib.suppress(ValueError, AttributeError):
                said = str(response.json().get("message") or said)  # the engine's JSON error
            raise docker.errors.APIError(f"{response.status_code} {response.reason}", response=response, explanation=said[:500])
        yield response.iter_content(chunk_size)
    finally:
        response.close()


class ChunkReader:
    """An iterator of chunks as a file, for tarfile's stream mode (which reads 10 KB at a time:
    each read takes its slice of the current chunk, no chunk is copied twice)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks
        self.chunk = b""
        self.offset = 0

    def read(self, size: int = -1) -> bytes:
        parts = []
        wanted = size
        while wanted != 0:
            if self.offset >= len(self.chunk):
                try:
                    self.chunk, self.offset = next(self.chunks), 0
                except StopIteration:
                    break
                continue
            end = len(self.chunk) if wanted < 0 else min(len(self.chunk), self.offset + wanted)
            parts.append(self.chunk[self.offset : end])
            if wanted > 0:
                wanted -= end - self.offset
            self.offset = end
        return b"".join(parts)
