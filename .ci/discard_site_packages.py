"""Free a tox env's installed packages after its tests, when CI asks (called by tox's commands_post).

Usage: ``python .ci/discard_site_packages.py FLAG``. With FLAG ``1`` (tox substitutes
``{env:PLASMID_CI_DISCARD_ENVS:0}``, which ``.ci/run`` sets), the running interpreter's
site-packages are deleted: the ten envs hold about 25 GB together and a CI machine's disk can
be smaller than that. The env's logs stay; its install record goes too, so tox recreates
the env on its next run. With any
other FLAG nothing is touched, so a developer's local envs are kept.
"""

from __future__ import annotations

import shutil
import sys
import sysconfig
from pathlib import Path


def main(argv: list[str]) -> int:
    if argv[1:] != ["1"]:
        return 0
    if sys.prefix == sys.base_prefix:
        print("discard_site_packages: not in a virtual env; nothing removed", file=sys.stderr)
        return 0
    for key in ("purelib", "platlib"):
        path = Path(sysconfig.get_paths()[key])
        if path.is_dir() and Path(sys.prefix) in path.parents:
            shutil.rmtree(path, ignore_errors=True)
    # tox's record of what it installed: without it the next run recreates the env
    (Path(sys.prefix) / ".tox-info.json").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
