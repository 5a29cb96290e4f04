"""What every benchmark records about the tree it ran: the commit.

The device machine receives a copy of the working tree whose `.git` may lag behind it, so the
caller can name the commit (`VOICEHUB_COMMIT`, set by gpu_session.sh from the lead's checkout);
otherwise git is asked, and None is recorded when neither knows.
"""

from __future__ import annotations

import os
import subprocess


def tree_commit() -> str | None:
    named = os.environ.get("VOICEHUB_COMMIT", "").strip()
    if named:
        return named
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:  # no git on the machine
        return None
    return rev or None
