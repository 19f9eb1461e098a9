"""Files written so that a crash never leaves half of one (token files, checkpoints), folders
replaced whole, and files read as untrusted input: bounded in size, never through a symbolic
link where a folder's files are copied, checked against their sha256 sums."""

import contextlib
import hashlib
import os
import shutil
import stat
import uuid

# the most bytes a file read whole may have (a config.json, a trainer state, a sums file are a
# few KB): a larger one is not one of them, and is refused before it is read
SMALL_FILE_BYTES = 16 << 20
SUMS = "SHA256SUMS"  # a folder's sums, in sha256sum's format: `sha256sum -c SHA256SUMS` checks


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


@contextlib.contextmanager
def replaced_whole(final):
    """with replaced_whole(final) as staging: write the folder's new files into staging.

    staging (final + ".new", made afresh) is swapped in for final when the block ends, by
    renames: final -> final.old, staging -> final, then final.old is deleted. A crash before
    the swap leaves final untouched; one between the two renames leaves it as final.old, which
    the next swap (and the readers: training/checkpoint.find_checkpoint) takes back. An error
    in the block removes staging and the parent folders made for it (while empty), and leaves
    final as it was."""
    final = os.path.abspath(final)
    staging, made = final + ".new", _first_missing(os.path.dirname(final))
    shutil.rmtree(staging, ignore_errors=True)
    try:
        os.makedirs(staging)
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        _remove_empty(os.path.dirname(final), made)
        raise
    old = final + ".old"
    if not os.path.isdir(final) and os.path.isdir(old):
        os.rename(old, final)  # an earlier swap died between its renames: old is the one
    shutil.rmtree(old, ignore_errors=True)
    if os.path.isdir(final):
        os.rename(final, old)
    os.rename(staging, final)
    fsync_dir(os.path.dirname(final))
    shutil.rmtree(old, ignore_errors=True)


def _first_missing(folder):
    """The outermost of folder and its parents that does not exist (None: folder exists)."""
    missing = None
    while not os.path.exists(folder):
        missing, parent = folder, os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return missing


def _remove_empty(folder, top):
    """Remove folder and its parents up to top (None: none), each only while it is empty: a
    folder someone else filled meanwhile is kept."""
    while top is not None:
        try:
            os.rmdir(folder)
        except OSError:
            return
        if folder == top:
            return
        folder = os.path.dirname(folder)


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


def copy_regular(src, dst, limit):
    """Copy the regular file src to dst -> True; False (nothing copied) when src is a symbolic
    link or not a regular file: a source folder's link may point anywhere (a secret, a device),
    so its target is never read. A file over limit bytes is a ValueError."""
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:  # a link (ELOOP), or nothing there
        return False
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        data = _read_bounded(f, src, limit)
    atomic_write(dst, data)
    return True


def file_sha256(path):
    """The hex sha256 of a whole file, read in 1 MB blocks (hashlib.file_digest)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_sums(folder, names):
    """Write folder/SHA256SUMS: the sha256 of each of names (files in folder), sha256sum's
    format."""
    lines = [f"{file_sha256(os.path.join(folder, n))}  {n}\n" for n in sorted(names)]
    atomic_write(os.path.join(folder, SUMS), "".join(lines).encode())


def read_sums(folder, allowed):
    """folder/SHA256SUMS as {name: hex sha256}; a ValueError for a line that is not
    `<64 hex digits>  <name>` or names a file outside allowed (the files this project writes
    there: no other file is ever opened by a name read from a file)."""
    path = os.path.join(folder, SUMS)
    try:
        text = read_small(path).decode("ascii")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a sums file (not ASCII); the file is corrupt") from None
    sums = {}
    for line in text.splitlines():
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64 or set(digest) - set("0123456789abcdef"):
            raise ValueError(f"{path}: {line[:80]!r} is not a sha256 line; the file is corrupt")
        if name not in allowed or name in sums:
            raise ValueError(f"{path}: names {name[:80]!r}, not a file of this folder")
        sums[name] = digest
    return sums


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
