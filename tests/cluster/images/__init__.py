"""Container images as local commands: what each image's filesystem adds, its ENTRYPOINT, CMD and USER."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
VENV_BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Image:
    """One image: files it places (image path -> local path, bind-mounted in the pod), entrypoint, cmd, user, env;
    `hidden` directories are covered by an empty tmpfs first (a host home the image's user could not enter)."""

    files: dict[str, Path]
    entrypoint: list[str]
    cmd: list[str]
    user: int
    env: dict[str, str] = field(default_factory=dict)
    hidden: list[str] = field(default_factory=list)


def _python_home() -> tuple[dict[str, Path], list[str]]:
    """The interpreter behind the virtualenv, reachable by the image's non-root user: when it lives under a directory
    others cannot enter (pyenv under /root), that directory becomes an empty tmpfs with just the interpreter in it."""
    prefix = Path(sys.base_prefix)
    closed = [p for p in reversed(prefix.parents) if p != Path("/") and not p.stat().st_mode & 0o001]
    if not closed:
        return {}, []
    return {str(prefix): prefix}, [str(closed[0])]


def _python_env() -> dict[str, str]:
    import pyspark

    return {
        "PATH": f"{VENV_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "JAVA_HOME": "/usr/lib/jvm/default-java",
        "SPARK_HOME": str(Path(pyspark.__file__).parent),
        "PYSPARK_PYTHON": "python3",
        "PYTHONUNBUFFERED": "1",
    }


def _repair_files(state: Path) -> dict[str, Path]:
    """/opt/bookfleet as the repair image's Dockerfile makes it: the entrypoint and the Spark job files."""
    opt = state / "images" / "repair-opt"
    opt.mkdir(parents=True, exist_ok=True)
    sources = [ROOT / "repair-image" / "entrypoint.sh", *ROOT.glob("bookfleet/*/spark_*.py")]
    for source in sources:
        link = opt / source.name
        with contextlib.suppress(FileExistsError):  # kubelets of several nodes start bookie pods at once
            link.symlink_to(source)
    return {"/opt/bookfleet": opt}


def _write_atomically(path: Path, text: str) -> None:
    """Several nodes' kubelets start pods of one image at once: a pod must never bind-mount a half-written file."""
    partial = path.with_name(f"{path.name}.{threading.get_ident()}")
    partial.write_text(text)
    os.replace(partial, path)


def _accounts(state: Path, user: str, uid: int) -> dict[str, Path]:
    """/etc/passwd and /etc/group with the image's user (its `useradd`): the JVM and Hadoop need a user name."""
    etc = state / "images" / f"etc-{user}"
    etc.mkdir(parents=True, exist_ok=True)
    passwd = [line for line in Path("/etc/passwd").read_text().splitlines() if line.split(":")[2] != str(uid)]
    group = [line for line in Path("/etc/group").read_text().splitlines() if line.split(":")[2] != str(uid)]
    _write_atomically(etc / "passwd", "\n".join([*passwd, f"{user}:x:{uid}:{uid}::/tmp:/usr/sbin/nologin"]) + "\n")
    _write_atomically(etc / "group", "\n".join([*group, f"{user}:x:{uid}:"]) + "\n")
    return {"/etc/passwd": etc / "passwd", "/etc/group": etc / "group"}


def resolve(reference: str, state: Path) -> Image | None:
    """The local stand-in for an image reference, or None when there is none (the pod then fails to start)."""
    python, hidden = _python_home()
    repository = reference.rsplit(":", 1)[0] if ":" in reference.rsplit("/", 1)[-1] else reference
    if repository.endswith("bookfleet/repair"):
        return Image(
            {**python, **_repair_files(state), **_accounts(state, "bookfleet", 10001)},
            ["/opt/bookfleet/entrypoint.sh"], ["bookfleet", "repair", "--help"], 10001, _python_env(), hidden,
        )
    for name, cmd in (("bookie", ["bookie", "--help"]), ("operator", ["operator"])):
        if repository.endswith(f"bookfleet/{name}"):  # tini as entrypoint: the pod's process is its own PID 1 here
            return Image(
                {**python, **_accounts(state, "bookfleet", 10001)}, [], ["bookfleet", *cmd], 10001, _python_env(),
                hidden,
            )
    if repository.split("/")[-1] == "zookeeper":
        env = _python_env()
        env["PATH"] = f"{HERE / 'zookeeper-bin'}:{env['PATH']}"
        return Image(
            {**python, "/docker-entrypoint.sh": HERE / "zookeeper-entrypoint.sh",
             **_accounts(state, "zookeeper", 1000)},
            ["/docker-entrypoint.sh"], ["zkServer.sh", "start-foreground"], 1000, {**env, "HOME": "/tmp"}, hidden,
        )
    return None
