"""argparse for the commands that take plain flags (``export``, ``maxload``): a bad flag is one line on stderr
naming the command's usage, exit code 2 (argparse would print its usage block too). ``check_output_file`` refuses
an output path that cannot be written before any work is done."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from placement_rl.errors import PlacementRLError


class OneLineParser(argparse.ArgumentParser):
    def __init__(self, *args, usage_line: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.usage_line = usage_line

    def error(self, message: str) -> None:
        print(f"error: {message} ({self.usage_line})", file=sys.stderr)
        sys.exit(2)


def check_output_file(path: str | None, flag: str) -> None:
    """``PlacementRLError`` unless ``path`` can be written as a regular file: not a folder, link, device or pipe,
    not under a file, and its nearest existing folder takes a new file (probed, nothing left behind; folders
    still missing are created only when the file is written)."""
    if not path:
        return
    target = Path(path)
    if target.is_dir() or path.endswith(("/", "\\")):
        raise PlacementRLError(f"{flag} {path} is a folder: give a file path")
    if target.is_symlink() or (target.exists() and not target.is_file()):
        raise PlacementRLError(f"{flag} {path} is not a regular file (a link, device or pipe): give a file path")
    folder = target.absolute().parent
    while not folder.exists() and not folder.is_symlink() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise PlacementRLError(f"{flag} {path} is under {folder}, which is not a folder: give a file path")
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=f".{target.name}.", suffix=".probe")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise PlacementRLError(f"{flag} {path} cannot be written ({exc.strerror or exc} in {folder})") from None


__all__ = ["OneLineParser", "check_output_file"]
