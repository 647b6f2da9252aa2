"""No file in the repository names a folder that exists on one machine only (a home, a workspace,
a mount): a script or doc that defaults to one fails everywhere else, as benchmarks/gallery_ann.py
once did. Paths every system has (/tmp, /proc, /etc, /usr) and the image's own (/opt/facegate) are
fine; a machine's data is reached through settings and variables (FACEGATE_TEST_DATA,
FACEGATE_MODEL_CACHE)."""

from __future__ import annotations

import re
import subprocess

from tests.conftest import REPO

# an absolute path under a root that holds one machine's own folders; not a shell variable's ($work/root/...)
MACHINE_PATH = re.compile(r"(?<![\w$}.~-])(?:/(?:home|Users|work|root|mnt|media)/[\w.-]+|[A-Za-z]:\\Users\\)")


def tracked_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [name for name in listed.decode().split("\0") if name]


def test_the_pattern_finds_what_it_is_for():
    def spelt(text: str) -> str:  # written in capitals here, so that this file holds no such path itself
        return text.replace("ROOT", "work").replace("HOME", "home").replace("USERS", "Users")

    found = [m.group(0) for m in MACHINE_PATH.finditer(spelt('default=Path("/ROOT/cache/x"), /HOME/ann/data, C:\\USERS\\ann, /USERS/bo/x'))]
    assert found == [spelt(p) for p in ("/ROOT/cache", "/HOME/ann", "C:\\USERS\\", "/USERS/bo")]
    assert not MACHINE_PATH.search('rm -rf "$work/root/var/cache" ~/work/x /tmp/int8 /opt/facegate/models ../shared/data')


def test_no_absolute_path_of_a_machine_in_the_repository():
    hits = []
    for name in tracked_files():
        try:
            text = (REPO / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):  # binaries (models, images); a file deleted but not staged
            continue
        hits += [f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}" for m in MACHINE_PATH.finditer(text)]
    assert not hits, "absolute paths of one machine (use a setting, a variable or a relative path):\n" + "\n".join(hits)
