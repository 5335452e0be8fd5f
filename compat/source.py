"""librdkafka's source with its test suite: fetched from npm, checked, built once.

The npm package @confluentinc/kafka-javascript ships librdkafka's whole source tree, tests
included, under deps/librdkafka/. The version is pinned and the tarball is checked against
the registry's sha512 integrity recorded here, so `make compat` builds the same suite every
time and a changed upload is refused rather than run.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from raftlog.errors import LocalError

NPM_PACKAGE = "@confluentinc/kafka-javascript"
NPM_VERSION = "1.10.1"
# `npm view @confluentinc/kafka-javascript@1.10.1 dist.integrity`
NPM_INTEGRITY = (
    "sha512-"
    "KVePUBn21EqCVP9mfxzEuM3SYJHHEF7X+iiC2e43QQgDSyEaksInmCGooT3w5q+cNAdkSCrK71j0ICfqoSqZLw=="
)
LIBRDKAFKA_VERSION = "2.15.1"
# What the package holds librdkafka under.
LIBRDKAFKA_SUBDIR = Path("package/deps/librdkafka")
# Optional features the broker-facing tests do not need and this machine may lack the
# development headers of (Kerberos, libcurl for OIDC); lz4 is built in.
CONFIGURE_ARGS = ("--disable-gssapi", "--disable-curl", "--disable-lz4-ext")
NPM_TIMEOUT_S = 600
BUILD_TIMEOUT_S = 3600
# Optional features configure looks for that decide which tests run, with the header its
# check includes (configure.self). A build made while one was missing is redone once the
# header appears: RapidJSON, for one, gates the tests that check the JSON statistics.
OPTIONAL_FEATURES = {"WITH_RAPIDJSON": "rapidjson/schema.h"}
# What the last complete build was made with, written after it succeeded.
BUILD_STAMP = ".raftlog-compat-build.json"
HEADER_CHECK_TIMEOUT_S = 60


class CompatSetupError(LocalError):
    """The suite could not be fetched, checked or built."""


@dataclass(frozen=True)
class Suite:
    """A built librdkafka source tree."""

    root: Path  # deps/librdkafka

    @property
    def tests_dir(self) -> Path:
        return self.root / "tests"

    @property
    def test_runner(self) -> Path:
        return self.tests_dir / "test-runner"

    @property
    def library_path(self) -> str:
        """LD_LIBRARY_PATH for the test-runner: the libraries just built, never a system
        librdkafka of another version."""
        return f"{self.root / 'src'}:{self.root / 'src-cpp'}"


def _integrity_of(path: Path) -> str:
    digest = hashlib.sha512(path.read_bytes()).digest()
    return "sha512-" + base64.b64encode(digest).decode()


def fetch(work_dir: Path) -> Path:
    """The pinned package's tarball in `work_dir` (fetched with `npm pack` unless present),
    after its integrity is checked."""
    work_dir.mkdir(parents=True, exist_ok=True)
    tarball = work_dir / f"confluentinc-kafka-javascript-{NPM_VERSION}.tgz"
    if not tarball.exists():
        if shutil.which("npm") is None:
            raise CompatSetupError("npm is not installed: it fetches librdkafka's test suite")
        done = subprocess.run(
            ["npm", "pack", f"{NPM_PACKAGE}@{NPM_VERSION}", "--silent"],
            cwd=work_dir,
            capture_output=True,
            text=True,
            timeout=NPM_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0 or not tarball.exists():
            raise CompatSetupError(
                f"npm pack {NPM_PACKAGE}@{NPM_VERSION} failed: {done.stderr.strip()[-500:]}"
            )
    integrity = _integrity_of(tarball)
    if integrity != NPM_INTEGRITY:
        tarball.unlink()
        raise CompatSetupError(
            f"{tarball.name}: integrity {integrity} is not the pinned {NPM_INTEGRITY}; "
            "the file was removed"
        )
    return tarball


def extract(tarball: Path, work_dir: Path) -> Path:
    """The librdkafka tree of the package, extracted once into `work_dir`."""
    root = work_dir / f"kafka-javascript-{NPM_VERSION}" / LIBRDKAFKA_SUBDIR
    if not (root / "configure").exists():
        target = work_dir / f"kafka-javascript-{NPM_VERSION}"
        shutil.rmtree(target, ignore_errors=True)
        with tarfile.open(tarball) as archive:
            # The 'data' filter refuses absolute paths, links out of the tree and devices.
            archive.extractall(target, filter="data")
        if not (root / "configure").exists():
            raise CompatSetupError(f"{tarball.name} holds no {LIBRDKAFKA_SUBDIR}")
    header = (root / "src" / "rdkafka.h").read_text(encoding="utf-8", errors="replace")
    found = re.search(r"#define RD_KAFKA_VERSION\s+0x([0-9a-fA-F]{8})", header)
    if found is None:
        raise CompatSetupError("rdkafka.h names no RD_KAFKA_VERSION")
    value = int(found.group(1), 16)
    version = f"{value >> 24}.{(value >> 16) & 0xFF}.{(value >> 8) & 0xFF}"
    if version != LIBRDKAFKA_VERSION:
        raise CompatSetupError(f"the package holds librdkafka {version}, not {LIBRDKAFKA_VERSION}")
    # The configure script and its helpers lose their mode bits in the npm tarball.
    for script in [root / "configure", *(root / "mklove").rglob("*.sh"), *root.glob("lds-gen.*")]:
        script.chmod(script.stat().st_mode | 0o111)
    return root


def configured_features(root: Path) -> dict[str, bool]:
    """What configure recorded in Makefile.config for each of OPTIONAL_FEATURES (a feature
    it did not mention counts as missing)."""
    path = root / "Makefile.config"
    text = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
    found = {}
    for feature in OPTIONAL_FEATURES:
        match = re.search(rf"^{feature}=\s*(\S+)", text, re.MULTILINE)
        found[feature] = match is not None and match.group(1) == "y"
    return found


def header_available(header: str) -> bool:
    """Whether the C++ compiler finds `header` on its default include path, as configure's
    compile check would."""
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        return False
    try:
        done = subprocess.run(
            [compiler, "-E", "-x", "c++", "-o", os.devnull, "-"],
            input=f"#include <{header}>\n",
            capture_output=True,
            text=True,
            timeout=HEADER_CHECK_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False  # no compiler to ask: configure would not find the header either
    return done.returncode == 0


def rebuild_reason(root: Path, available: Callable[[str], bool] = header_available) -> str | None:
    """Why the tree must be (re)built, or None when its last build still holds: no
    test-runner, no record of a complete build, other configure arguments, or an optional
    feature configure found missing whose header is there now."""
    if not Suite(root).test_runner.exists():
        return "not built yet"
    stamp = root / BUILD_STAMP
    try:
        made_with = json.loads(stamp.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "no record of a complete build"
    if not isinstance(made_with, dict) or made_with.get("configure_args") != list(CONFIGURE_ARGS):
        return "built with other configure arguments"
    for feature, present in configured_features(root).items():
        if not present and available(OPTIONAL_FEATURES[feature]):
            return f"built without {feature}, whose {OPTIONAL_FEATURES[feature]} is now installed"
    return None


def build(root: Path, log_path: Path, available: Callable[[str], bool] = header_available) -> Suite:
    """configure, the library and the test-runner, unless the last build still holds (see
    rebuild_reason); the compiler's output goes to `log_path`."""
    suite = Suite(root)
    reason = rebuild_reason(root, available)
    if reason is None:
        return suite
    # Until the build completes there is no runner and no stamp: a build stopped half way
    # is redone, never taken for a finished one.
    (root / BUILD_STAMP).unlink(missing_ok=True)
    suite.test_runner.unlink(missing_ok=True)
    jobs = str(os.cpu_count() or 1)
    steps = [
        ["./configure", *CONFIGURE_ARGS],
        # Objects of an earlier build were compiled against another config.h. (The top
        # Makefile's clean also visits examples/, which the npm package leaves out.)
        *(["make", "-C", subdir, "clean"] for subdir in ("src", "src-cpp", "tests")),
        ["make", "-j", jobs, "libs"],
        ["make", "-C", "tests", "-j", jobs, "build"],
    ]
    with log_path.open("w", encoding="utf-8") as log_file:
        log_file.write(f"# building: {reason}\n")
        for step in steps:
            log_file.write(f"$ {' '.join(step)}\n")
            log_file.flush()
            done = subprocess.run(
                step,
                cwd=root,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                timeout=BUILD_TIMEOUT_S,
                check=False,
            )
            if done.returncode != 0:
                raise CompatSetupError(
                    f"`{' '.join(step)}` failed (exit {done.returncode}); see {log_path}"
                )
    if not suite.test_runner.exists():
        raise CompatSetupError(f"the build made no {suite.test_runner}; see {log_path}")
    (root / BUILD_STAMP).write_text(
        json.dumps({"configure_args": list(CONFIGURE_ARGS), **configured_features(root)}),
        encoding="utf-8",
    )
    return suite


def prepare(work_dir: Path) -> Suite:
    """Fetch, check, extract and build: the suite ready to run."""
    root = extract(fetch(work_dir), work_dir)
    return build(root, work_dir / "build.log")
