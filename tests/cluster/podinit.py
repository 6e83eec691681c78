"""The inside of one container start: run as root in the pod's network namespace (`ip netns exec`, which also gives
a private mount namespace and the pod's /etc/hosts) and a private UTS namespace; bind-mount the volumes at their
mount paths, set the hostname, drop to the pod's user and exec the container's command.

Standalone on purpose (no imports from the repository): it runs before the container's own environment exists.
Usage: python3 podinit.py SPEC.json
"""

import json
import os
import socket
import subprocess
import sys


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def main() -> None:
    with open(sys.argv[1]) as file:
        spec = json.load(file)
    mount("--make-rprivate", "/")
    # Hold every source open first: a volume mounted at /tmp must not hide a later source that lives under /tmp.
    sources = [os.open(volume["source"], os.O_PATH) for volume in spec["mounts"]]
    for directory in spec["hidden"]:
        mount("-t", "tmpfs", "-o", "mode=755", "tmpfs", directory)
    for volume, source in zip(spec["mounts"], sources, strict=True):
        target = volume["target"]
        if not os.path.lexists(target):  # only inside a hidden directory's tmpfs: the kubelet made the others
            os.makedirs(target)
        mount("--no-canonicalize", "--bind", f"/proc/{os.getpid()}/fd/{source}", target)
        if volume["readOnly"]:
            mount("-o", "remount,bind,ro", volume["target"])
    if spec["readOnlyRootFilesystem"]:
        mount("-o", "remount,bind,ro", "/")
    socket.sethostname(spec["hostname"])
    os.setgroups(spec["groups"])
    os.setgid(spec["gid"])
    os.setuid(spec["uid"])
    os.chdir(spec["workingDir"])
    os.execvpe(spec["argv"][0], spec["argv"], spec["env"])


if __name__ == "__main__":
    main()
