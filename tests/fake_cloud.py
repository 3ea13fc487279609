"""A stand-in cloud CLI for the provider tests: ``up`` starts a real sshd box on 127.0.0.1,
``down`` ends it.  Run as ``python tests/fake_cloud.py up ROOT GPU_NAME`` / ``down ROOT``.

``up`` prints the JSON a cloud CLI would (ssh_host/ssh_port/ssh_user, a handle, the key) plus
the box folder and tmux socket to use, so two boxes on this one machine never share them.  The
box reports GPU_NAME as its card (``EMMY_BOX_CARD_NAME``); its rows stay labelled interpret.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.sshd import SSHD, SSHServer  # noqa: E402


class CardBox(SSHServer):
    def __init__(self, root: Path, card_name: str) -> None:
        super().__init__(root)
        self.card_name = card_name

    def session_env(self) -> dict[str, str]:
        return {**super().session_env(), "EMMY_BOX_CARD_NAME": self.card_name}


def socket_name(root: Path) -> str:
    """One tmux server per fake server, also when two tests rent the same card at once."""
    return f"fake-{root.name}-{hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:8]}"


def up(root: Path, card_name: str) -> int:
    if not SSHD.is_file():
        print(f"{SSHD} missing", file=sys.stderr)
        return 3
    root.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    for old in root.glob("*key*"):  # a server made again in the same place gets new keys
        old.unlink()
    box = CardBox(root, card_name)
    box._write_files()
    box.start()
    (root / "events").open("a").write(f"up {card_name}\n")
    print("creating instance ... ok")  # chatter before the JSON, like real CLIs
    print(json.dumps({"ssh_host": box.host, "ssh_port": box.port, "ssh_user": box.user,
                      "ssh_key": str(box.client_key), "handle": str(root),
                      "box_dir": str(root / "box"), "tmux_socket": socket_name(root)}))
    return 0


def down(root: Path) -> int:
    pid_file = root / "sshd.pid"
    if pid_file.is_file():
        try:
            os.kill(int(pid_file.read_text().split()[0]), signal.SIGTERM)
        except ProcessLookupError:
            pass
    subprocess.run(["tmux", "-L", socket_name(root), "kill-server"], capture_output=True)
    (root / "events").open("a").write("down\n")
    return 0


if __name__ == "__main__":
    cmd, root = sys.argv[1], Path(sys.argv[2])
    sys.exit(up(root, sys.argv[3]) if cmd == "up" else down(root))
