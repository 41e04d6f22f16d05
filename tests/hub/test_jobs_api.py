"""The jobs API's pure parts: a job's output downloaded a chunk at a time."""

from __future__ import annotations

import asyncio
from pathlib import Path

from hub.jobs_api import log_chunks
from spawner.line import LogRead


def test_a_download_reads_the_output_a_chunk_at_a_time_up_to_its_size_when_asked(tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    log.write_bytes(bytes(range(256)) * 40)  # 10,240 bytes
    reads: list[LogRead] = []

    async def read(window: LogRead) -> tuple[bytes, int]:
        reads.append(window)
        with log.open("rb") as out:
            out.seek(window.offset)
            data = out.read(window.most if window.most is not None else -1)
        size = log.stat().st_size
        with log.open("ab") as out:
            out.write(b"more")  # the job goes on writing: the download still ends
        return data, size

    async def download() -> bytes:
        first, size = await read(LogRead(most=4096))
        return b"".join([piece async for piece in log_chunks(read, first, size, chunk=4096)])

    whole = asyncio.run(download())
    assert whole == bytes(range(256)) * 40
    assert [(r.offset, r.most) for r in reads] == [(0, 4096), (4096, 4096), (8192, 2048)]
