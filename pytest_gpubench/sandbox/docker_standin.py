"""The ``docker`` command of a sandbox instance: images, pulls and seed-004 worker containers.

Run as ``python -m pytest_gpubench.sandbox.docker_standin ARGS`` (the instance's
``bin/docker`` wrapper does that). What it does, in Docker's own words:

``docker --version``
    ``Docker version 27.3.1, build ce12230``.
``docker image inspect IMAGE``
    the image's JSON when it was pulled, else exit 1 with ``Error: No such image: IMAGE``.
``docker pull IMAGE``
    layer progress lines while the image downloads: its size from the catalog's
    ``docker_images`` table (by repository, ``default`` otherwise) at the provider's
    pull rate, time-scaled, so a heavy image (``vllm/vllm-openai``) pulls for minutes
    before scaling; then ``Status: Downloaded newer image for IMAGE``.
``docker images``, ``docker image rm IMAGE`` (``rmi``)
    the pulled images as a table; forget one.
``docker run [--rm] [-i] [--gpus device=N|"device=N,M"|all] [-e NAME=VALUE]... [--label L]... [--name N] IMAGE [CMD...]``
    pulls an absent image first (as Docker does, ``Unable to find image``), checks the
    GPU device exists (else exit 125), then becomes the container: the stand-in worker
    (:mod:`.worker_standin`) with the ``-e`` variables, the command words in
    ``GPUBENCH_WORKER_COMMAND``. Containers are kept in the state directory until
    they exit, for ``ps`` and ``rm``.
``docker ps -q [--filter label=L]`` and ``docker rm -f ID...``
    the running containers' ids; ``rm -f`` kills them.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .instance_spec import MIB, InstanceSpec, load_instance_spec

DOCKER_VERSION = "Docker version 27.3.1, build ce12230"
WORKER_MODULE = "pytest_gpubench.sandbox.worker_standin"
#: Progress lines a pull prints while it downloads.
PULL_STEPS = 10


def repository(image: str) -> str:
    """``registry/name:tag@digest`` -> ``registry/name``."""
    image = image.split("@", 1)[0]
    last = image.rsplit("/", 1)
    if ":" in last[-1]:
        image = image[: image.rfind(":")]
    return image


def _images_path(spec: InstanceSpec) -> Path:
    return spec.state_dir / "docker" / "images.json"


def pulled_images(spec: InstanceSpec) -> dict[str, dict]:
    try:
        return json.loads(_images_path(spec).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def image_size(spec: InstanceSpec, image: str) -> int:
    table = spec.docker_images
    return int(table.get(repository(image), table.get("default", 500 * MIB)))


def _normal(image: str) -> str:
    return image if ":" in image.rsplit("/", 1)[-1] or "@" in image else image + ":latest"


def pull_seconds(spec: InstanceSpec, image: str) -> float:
    """Emulated seconds a pull of ``image`` takes (before the time scale): its size at the pull rate."""
    return image_size(spec, image) / MIB / spec.ollama.pull_mb_per_s


def pull(spec: InstanceSpec, image: str, out: object = sys.stdout) -> None:
    """Download ``image`` (time-scaled), printing Docker's progress lines."""
    image = _normal(image)
    size = image_size(spec, image)
    seconds = spec.scaled(pull_seconds(spec, image))
    digest = "sha256:" + hashlib.sha256(image.encode()).hexdigest()
    layer = digest[7:19]
    print(f"{image.rsplit(':', 1)[-1]}: Pulling from {repository(image)}", file=out, flush=True)
    for step in range(1, PULL_STEPS + 1):
        time.sleep(seconds / PULL_STEPS)
        done = size * step // PULL_STEPS
        print(f"{layer}: Downloading  {done / MIB:.1f}MB/{size / MIB:.1f}MB", file=out, flush=True)
    print(f"{layer}: Pull complete", file=out, flush=True)
    print(f"Digest: {digest}", file=out, flush=True)
    print(f"Status: Downloaded newer image for {image}", file=out, flush=True)
    images = pulled_images(spec)
    images[image] = {"Id": digest, "RepoTags": [image], "Size": size, "Created": time.time()}
    _save_images(spec, images)


def _save_images(spec: InstanceSpec, images: dict[str, dict]) -> None:
    path = _images_path(spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".tmp").write_text(json.dumps(images), encoding="utf-8")
    path.with_suffix(".tmp").replace(path)


def remove_images(spec: InstanceSpec, names: Sequence[str]) -> int:
    """``docker image rm``: forget pulled images."""
    images = pulled_images(spec)
    for name in names:
        if images.pop(_normal(name), None) is None:
            print(f"Error response from daemon: No such image: {name}", file=sys.stderr)
            return 1
        print(f"Untagged: {_normal(name)}")
    _save_images(spec, images)
    return 0


def _containers(spec: InstanceSpec) -> Path:
    return spec.state_dir / "docker" / "containers"


def running_containers(spec: InstanceSpec, label: str | None = None) -> list[str]:
    ids = []
    for entry in sorted(_containers(spec).glob("*.json")):
        try:
            info = json.loads(entry.read_text(encoding="utf-8"))
            os.kill(int(info["pid"]), 0)
        except (OSError, ValueError, KeyError):
            entry.unlink(missing_ok=True)
            continue
        if label is None or label in info.get("labels", []):
            ids.append(entry.stem)
    return ids


def remove(spec: InstanceSpec, ids: Sequence[str]) -> int:
    for container in ids:
        entry = _containers(spec) / f"{container}.json"
        try:
            info = json.loads(entry.read_text(encoding="utf-8"))
            pid = int(info["pid"])
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError, KeyError):
            print(f"Error response from daemon: No such container: {container}", file=sys.stderr)
            return 1
        entry.unlink(missing_ok=True)
        print(container)
    return 0


def run(spec: InstanceSpec, args: list[str]) -> int:
    """``docker run``: become the container (never returns on success)."""
    env: dict[str, str] = {}
    labels: list[str] = []
    device = "0"
    index = 0
    while index < len(args) and args[index].startswith("-"):
        flag = args[index]
        value = args[index + 1] if index + 1 < len(args) else ""
        if flag in ("--rm", "-i", "--interactive", "-t", "-it", "-d"):
            index += 1
            continue
        if flag in ("-e", "--env"):
            name, _, text = value.partition("=")
            env[name] = text
        elif flag == "--gpus":
            value = value.strip('"')  # '"device=0,1"': Docker reads the option as CSV, so a list is quoted
            device = value.split("=", 1)[1] if value.startswith("device=") else "0"
        elif flag == "--label":
            labels.append(value)
        elif flag not in ("--name", "-v", "--volume", "--shm-size", "--network", "-p"):
            print(f"unknown flag: {flag}", file=sys.stderr)
            return 125
        index += 2
    if index >= len(args):
        print('"docker run" requires at least 1 argument.', file=sys.stderr)
        return 125
    image, command = _normal(args[index]), args[index + 1:]
    for number in device.split(","):
        if not number.isdigit() or int(number) >= spec.gpu.count:
            print(f"docker: Error response from daemon: could not select device driver \"nvidia\" with "
                  f"capabilities: [[gpu]]: device {number} not found.", file=sys.stderr)
            return 125
    if image not in pulled_images(spec):
        print(f"Unable to find image '{image}' locally", file=sys.stderr, flush=True)
        pull(spec, image, out=sys.stderr)
    container = hashlib.sha256(f"{os.getpid()}-{time.time()}".encode()).hexdigest()[:12]
    _containers(spec).mkdir(parents=True, exist_ok=True)
    (_containers(spec) / f"{container}.json").write_text(
        json.dumps({"pid": os.getpid(), "image": image, "labels": labels}), encoding="utf-8")
    try:
        os.setpgid(0, 0)  # its own process group, as a container's processes are
    except OSError:
        pass  # a session leader already leads its group
    environ = {**os.environ, **env, "GPU_DEVICE": env.get("GPU_DEVICE", device),
               "GPUBENCH_WORKER_COMMAND": " ".join(command)}
    os.execve(sys.executable, [sys.executable, "-m", WORKER_MODULE], environ)
    return 0  # pragma: no cover - execve does not return


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["--version"], ["-v"]) or args[:1] == ["version"]:
        print(DOCKER_VERSION)
        return 0
    try:
        spec = load_instance_spec()
    except RuntimeError as exc:
        print(f"Cannot connect to the Docker daemon: {exc}", file=sys.stderr)
        return 1
    if args[:2] == ["image", "inspect"] and len(args) > 2:
        images = pulled_images(spec)
        found = [images[_normal(name)] for name in args[2:] if _normal(name) in images]
        if len(found) < len(args) - 2:
            missing = next(name for name in args[2:] if _normal(name) not in images)
            print("[]")
            print(f"Error: No such image: {missing}", file=sys.stderr)
            return 1
        print(json.dumps(found, indent=4))
        return 0
    if (args[:2] == ["image", "rm"] or args[:1] == ["rmi"]) and len(args) > 1:
        return remove_images(spec, args[2:] if args[0] == "image" else args[1:])
    if args[:1] == ["pull"] and len(args) == 2:
        pull(spec, args[1])
        return 0
    if args[:1] == ["images"]:
        print(f"{'REPOSITORY':<40} {'TAG':<12} {'IMAGE ID':<14} SIZE")
        for name, info in pulled_images(spec).items():
            repo, tag = repository(name), name.rsplit(":", 1)[-1]
            print(f"{repo:<40} {tag:<12} {info['Id'][7:19]:<14} {info['Size'] / MIB:.0f}MB")
        return 0
    if args[:1] == ["run"]:
        return run(spec, args[1:])
    if args[:1] == ["ps"]:
        label = next((a.split("=", 1)[1] for a in args if a.startswith("label=")), None)
        for container in running_containers(spec, label):
            print(container)
        return 0
    if args[:2] == ["rm", "-f"]:
        return remove(spec, args[2:])
    print(f"docker: '{' '.join(args[:2])}' is not a docker command the sandbox knows.", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
