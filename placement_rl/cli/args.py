"""argparse for the commands that take plain flags (``export``, ``maxload``): a bad flag is one line on stderr
naming the command's usage, exit code 2 (argparse would print its usage block too)."""

from __future__ import annotations

import argparse
import sys


class OneLineParser(argparse.ArgumentParser):
    def __init__(self, *args, usage_line: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.usage_line = usage_line

    def error(self, message: str) -> None:
        print(f"error: {message} ({self.usage_line})", file=sys.stderr)
        sys.exit(2)


__all__ = ["OneLineParser"]
