"""The inside of one container start: run as root in the pod's network namespace (`ip netns exec`, which also gives
a private mount namespace and the pod's /etc/hosts) and a private UTS namespace; bind-mount the volumes at their
mount paths, set the hostname, drop to the pod's user and exec the container's command. Dropping to the pod's user
clears the kernel's parent-death signal the kubelet armed (bookfleet.childprocess), so it is armed again after.

Standalone on purpose (no imports from the repository): it runs before the container's own environment exists.
Usage: python3 podinit.py SPEC.json
"""

import ctypes
import json
import os
import socket
import subprocess
import sys


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


PR_SET_PDEATHSIG, PR_GET_PDEATHSIG = 1, 2
LIBC = ctypes.CDLL(None, use_errno=True)


def parent_death_signal() -> int:
    armed = ctypes.c_int()
    LIBC.prctl(PR_GET_PDEATHSIG, ctypes.byref(armed), 0, 0, 0)
    return armed.value


def rearm_parent_death_signal(signal_number: int, parent: int) -> None:
    """Arm it again after a change of user, and take it at once if the kubelet died in between."""
    if signal_number:
        LIBC.prctl(PR_SET_PDEATHSIG, signal_number, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal_number)


def main() -> None:
    death_signal, kubelet = parent_death_signal(), os.getppid()
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
    rearm_parent_death_signal(death_signal, kubelet)
    os.chdir(spec["workingDir"])
    os.execvpe(spec["argv"][0], spec["argv"], spec["env"])


if __name__ == "__main__":
    main()
