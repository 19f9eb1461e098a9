"""Writing files so that a crash never leaves half of one (token files, checkpoints)."""

import hashlib
import os
import uuid


def atomic_write(path, data: bytes):
    """Write to a temporary file beside path, fsync it, then rename over path and fsync the
    folder: a crash at any point leaves either the old file or the new one, never half of one,
    and no temporary file behind when the write itself fails."""
    path = os.fspath(path)
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def fsync_dir(path):
    """Make a folder's entries (renames into it) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_sha256(path):
    """The hex sha256 of a whole file, read in 1 MB blocks (hashlib.file_digest)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
