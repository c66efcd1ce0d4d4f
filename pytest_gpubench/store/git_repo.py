"""Git plumbing for the git store: one private clone of a results repository.

Every command runs through :func:`run_git` (an argument list, never a shell) with a
fixed author and configuration, so a user's hooks, signing or pull settings change
nothing, and with ``GIT_TERMINAL_PROMPT=0`` so a missing credential is an error, not
a prompt that hangs a test run. Credentials in the URL never reach git's command line nor
the clone's ``.git/config``: :class:`Remote` takes them out of the URL and hands an
``http(s)://`` one to git as an ``Authorization`` header through the environment. What git
prints is passed through :func:`~.redaction.redact` before it reaches a message as well.

:class:`Clone` knows four moves, which are all the git store needs: start from the
remote's latest commit (:meth:`Clone.sync`, a fetch and a hard reset), commit what
was written (:meth:`Clone.commit`) and push it (:meth:`Clone.push`, False when another
push won the race).
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
from pathlib import Path
from typing import NamedTuple
from urllib.parse import unquote, urlsplit

from ..errors import StoreProblem, UsageProblem
from ..errors import one_line
from .redaction import redact, split_userinfo

__all__ = ["AUTHOR", "Clone", "Remote", "ensure_bare_repository", "git_url", "local_path", "run_git"]

#: Who the git store's commits are by, whoever runs it.
AUTHOR = ("gpubench", "gpubench@localhost")
#: The transports a results repository may be reached by (``git+URL``).
ALLOWED_SCHEMES = ("file", "ssh", "https", "http", "git")
_CONFIG = ("-c", f"user.name={AUTHOR[0]}", "-c", f"user.email={AUTHOR[1]}", "-c", "commit.gpgsign=false",
           "-c", "core.hooksPath=/dev/null", "-c", "gc.auto=0", "-c", "advice.detachedHead=false")
_TIMEOUT = 120.0


def git_url(location: str) -> str:
    """The URL git is given for a ``git+URL`` location; a ``UsageProblem`` when the transport is
    not one of :data:`ALLOWED_SCHEMES` or the URL names no repository."""
    if not location.startswith("git+"):
        raise UsageProblem(f"{redact(location)}: a git store is git+URL (git+file:///srv/results.git)")
    url = location.removeprefix("git+")
    parts = urlsplit(url)
    if parts.scheme not in ALLOWED_SCHEMES or not re.match(r"^[a-z]+://", url):
        raise UsageProblem(f"{redact(location)}: a results repository is reached by "
                         f"{', '.join(s + '://' for s in ALLOWED_SCHEMES)}")
    if parts.scheme == "file" and not parts.path:
        raise UsageProblem(f"{redact(location)}: git+file:///PATH names a repository by its absolute path")
    if parts.scheme != "file" and not parts.hostname:
        raise UsageProblem(f"{redact(location)}: the URL names no host")
    return url


def local_path(url: str) -> Path | None:
    """The directory a ``file://`` URL names; None for a remote URL."""
    parts = urlsplit(url)
    return Path(unquote(parts.path)) if parts.scheme == "file" else None


class Remote(NamedTuple):
    """A repository URL split into what git may see and the credential it must not keep."""

    #: The URL git is given: no password or token in it (an ssh user name stays).
    url: str
    #: ``(origin, "Authorization: Basic ...")`` for an ``http(s)`` URL that carried credentials.
    header: tuple[str, str] | None = None

    @classmethod
    def of(cls, url: str) -> Remote:
        """``url`` without its userinfo; an ``http(s)`` URL's user and password (or token as user
        name) become a Basic ``Authorization`` header for that origin (what git sends for them)."""
        head, userinfo, rest = split_userinfo(url)
        if userinfo is None:
            return cls(url)
        scheme = head[:-3].lower()
        if scheme == "ssh":  # a user name ssh needs; a password ssh cannot take from a URL
            return cls(f"{head}{userinfo.partition(':')[0]}@{rest}")
        if scheme not in ("http", "https"):  # file:// and git:// have no use for credentials
            return cls(head + rest)
        user, _, password = userinfo.partition(":")
        token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()
        origin = head + re.split(r"[/?#]", rest, maxsplit=1)[0] + "/"
        return cls(head + rest, (origin, f"Authorization: Basic {token}"))

    def environment(self) -> dict[str, str]:
        """Git's configuration for the header, by ``GIT_CONFIG_COUNT`` after any the environment has
        (so it is in no file and on no command line, where other users' ``ps`` would see it)."""
        if self.header is None:
            return {}
        origin, value = self.header
        index = int(os.environ.get("GIT_CONFIG_COUNT") or 0)
        return {"GIT_CONFIG_COUNT": str(index + 1), f"GIT_CONFIG_KEY_{index}": f"http.{origin}.extraHeader",
                f"GIT_CONFIG_VALUE_{index}": value}


def _environment(remote: Remote | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(GIT_TERMINAL_PROMPT="0", GIT_ALLOW_PROTOCOL=":".join(ALLOWED_SCHEMES), LC_ALL="C",
               GIT_CONFIG_NOSYSTEM="1")
    # A developer's environment may point git elsewhere; the clone is ours alone.
    for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        env.pop(name, None)
    if remote is not None:
        env.update(remote.environment())
    return env


def run_git(*args: str, cwd: Path | None = None, check: bool = True,
            remote: Remote | None = None) -> subprocess.CompletedProcess[str]:
    """``git ARGS`` with the fixed author and configuration (and ``remote``'s credentials, when it
    has some); a :class:`~..errors.StoreProblem` when it fails and ``check`` (else the completed
    process, to read its return code)."""
    try:
        done = subprocess.run(["git", *_CONFIG, *args], cwd=cwd, env=_environment(remote), capture_output=True,
                              text=True, timeout=_TIMEOUT, check=False)
    except FileNotFoundError as exc:
        raise StoreProblem("git store: git is not installed (the git+URL store runs git)") from exc
    except subprocess.TimeoutExpired as exc:
        raise StoreProblem(f"git {redact(' '.join(args[:2]))}: no answer in {_TIMEOUT:.0f} s") from exc
    if check and done.returncode != 0:
        raise StoreProblem(f"git {redact(' '.join(args[:2]))} failed: {redact(done.stderr.strip() or done.stdout)}")
    return done


def _one_line(output: str) -> str:
    """What git said, on one line (nothing a terminal obeys) and without a password, for a warning."""
    return redact(" ".join(one_line(output).split()))


def ensure_bare_repository(path: Path) -> bool:
    """Create an empty bare repository at ``path`` unless one is there; whether it was created."""
    if (path / "HEAD").is_file():
        return False
    path.mkdir(parents=True, exist_ok=True)
    run_git("init", "--bare", "-q", "--initial-branch=main", str(path))
    return True


class Clone:
    """A private clone of the results repository, on one branch; not shared between processes."""

    def __init__(self, url: str, directory: Path, branch: str | None = None) -> None:
        self.remote = Remote.of(url)
        #: The URL without credentials: what the clone's ``.git/config`` holds.
        self.url = self.remote.url
        self.directory = directory
        run_git("clone", "-q", "--no-tags", "--", self.url, str(directory), remote=self.remote)
        self.branch = branch or self._remote_branch(url) or "main"
        if not self._has_remote_branch():
            self._first_commit()
        self.sync()

    def git(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``git ARGS`` in this clone."""
        return run_git(*args, cwd=self.directory, check=check, remote=self.remote)

    def _remote_branch(self, url: str) -> str | None:
        """The branch the remote's ``HEAD`` names: the branch a plain ``git clone`` checks out.

        A remote whose ``HEAD`` names no existing branch (an empty repository, ``git init
        --bare`` with any default branch: ``master``, ``trunk``) sets no ``origin/HEAD`` and
        ``ls-remote --symref`` prints nothing for it; its ``HEAD`` is read from the repository
        itself for a ``file://`` one, else from the fresh clone, whose own ``HEAD`` git (2.31 and
        later) sets to the remote's unborn branch. The first commit then goes to that branch.
        """
        head = self.git("symbolic-ref", "-q", "--short", "refs/remotes/origin/HEAD", check=False)
        if head.returncode == 0 and head.stdout.strip():
            return head.stdout.strip().removeprefix("origin/")
        branch = self._unborn_head(url)
        if not branch:
            return None
        if not self._fetched(branch) and self._fetched("main"):
            # HEAD names a branch that is not there while ``main`` is: earlier versions of this store,
            # which could not read an unborn HEAD, pushed there; their results stay the record.
            return "main"
        return branch

    def _unborn_head(self, url: str) -> str:
        """The branch a remote's ``HEAD`` names although it does not exist ("" when not known)."""
        path = local_path(url)
        if path is not None:  # a bare repository on this machine: its HEAD, whatever git's version
            found = run_git("--git-dir", str(path), "symbolic-ref", "-q", "--short", "HEAD", check=False)
            if found.stdout.strip():
                return found.stdout.strip()
        return self.git("symbolic-ref", "-q", "--short", "HEAD", check=False).stdout.strip()

    def _fetched(self, branch: str) -> bool:
        """Whether the clone fetched ``branch`` from the remote (it has it), without asking it again."""
        return self.git("rev-parse", "-q", "--verify", f"refs/remotes/origin/{branch}", check=False).returncode == 0

    def _has_remote_branch(self) -> bool:
        return bool(self.git("ls-remote", "--heads", "origin", f"refs/heads/{self.branch}").stdout.strip())

    def _first_commit(self) -> None:
        """An empty remote gets a first commit (whoever pushes it first; a lost race is fine)."""
        self.git("checkout", "-q", "--orphan", self.branch)
        readme = self.directory / "data" / "README.md"
        readme.parent.mkdir(parents=True, exist_ok=True)
        readme.write_text("Results of pytest-gpubench's git store (docs/git-mode.md).\n")
        self.commit("gpubench: start the results repository")
        self.push()

    def sync(self) -> bool:
        """Make the work tree the remote branch's latest commit, dropping anything not pushed; False
        when the remote did not answer (the work tree is then the last commit fetched from it)."""
        fetched = self.git("fetch", "-q", "--no-tags", "origin",
                           f"+refs/heads/{self.branch}:refs/remotes/origin/{self.branch}", check=False)
        self.last_fetch_error = _one_line(fetched.stderr) if fetched.returncode else ""
        self.git("reset", "-q", "--hard", f"refs/remotes/origin/{self.branch}")
        return fetched.returncode == 0

    def discard(self) -> None:
        """Drop what was written and not committed (a transaction that raised half way)."""
        self.git("reset", "-q", "--hard")
        self.git("clean", "-q", "-f", "-d", "--", "data")

    def commit(self, message: str) -> None:
        """Commit everything under ``data/`` (the caller knows something changed)."""
        self.git("add", "-A", "--", "data")
        self.git("commit", "-q", "--no-verify", "--allow-empty", "-m", message)

    def push(self) -> bool:
        """Push the branch; False when the remote moved on (another clone pushed first) or
        could not be reached: the caller syncs and tries again."""
        done = self.git("push", "-q", "--porcelain", "origin", f"HEAD:refs/heads/{self.branch}", check=False)
        self.last_push_error = _one_line(done.stderr) if done.returncode else ""
        return done.returncode == 0

    last_push_error: str = ""
    last_fetch_error: str = ""
