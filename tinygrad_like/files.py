"""Writing files so that a crash never leaves half of one (token files, checkpoints), and
reading files as untrusted input: bounded in size, checked against their sha256 sums."""

import hashlib
import os
import stat
import uuid

# the most bytes a file read whole may have (a config.json, a trainer state, a sums file are a
# few KB): a larger one is not one of them, and is refused before it is read
SMALL_FILE_BYTES = 16 << 20


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


def read_small(path, limit=SMALL_FILE_BYTES):
    """The bytes of a file read whole (a JSON config or state), or a ValueError naming it when
    it is not a regular file (a FIFO or a device never ends) or is over limit bytes: checked
    before anything is read."""
    with open(path, "rb") as f:
        return _read_bounded(f, path, limit)


def _read_bounded(f, path, limit):
    """f's bytes when it is a regular file of at most limit bytes, else a ValueError."""
    info = os.fstat(f.fileno())
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"{path}: not a regular file")
    data = f.read(info.st_size + 1) if info.st_size <= limit else b""  # + 1: a file growing
    if info.st_size > limit or len(data) > limit:
        raise ValueError(
            f"{path}: {max(info.st_size, len(data)):,} bytes, over the {limit:,} such a file "
            "may have: refused unread"
        )
    return data


def file_sha256(path):
    """The hex sha256 of a whole file, read in 1 MB blocks (hashlib.file_digest)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def verify_sums(folder, sums, where):
    """Check each file of sums ({name: hex sha256}, names of folder's files) -> None, or a
    ValueError naming the file that is missing or whose bytes differ from the sum `where` (the
    file that holds the sums) saved."""
    for name, expected in sums.items():
        path = os.path.join(folder, name)
        try:
            found = file_sha256(path)
        except FileNotFoundError:
            raise ValueError(f"{path}: missing, though {where} lists it") from None
        if found != expected:
            raise ValueError(
                f"{path}: its sha256 does not match the one saved in {where}: the file is corrupt"
            )
