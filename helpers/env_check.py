"""`python -m helpers.env_check`: is this environment ready for the lessons?

Prints one line per requirement, `[ ok ]`, `[FAIL]`, `[warn]` (optional, missing) or
`[info]` (facts: the GPU, Colab, the scale the lessons would pick and why, the memory
method), and exits 1 when a required piece is missing or too old, else 0.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import sys
from dataclasses import dataclass

# Keep in step with pyproject.toml's [project] requirements (tests/test_env_check.py checks it).
PYTHON_FLOOR = (3, 11)
REQUIRED = {"torch": (2, 5), "ipywidgets": (7, 6), "matplotlib": (3, 7), "tqdm": (4, 66)}
OPTIONAL = {"jupyterlab": "for `make lab`; Colab and other hosted notebooks do not need it"}
FRAMEWORKS_WHY = "lesson 10 and --hf-config of other model types; the `frameworks` extra"
STATUSES = ("ok", "FAIL", "warn", "info")


@dataclass(frozen=True)
class Check:
    """One line of the report."""

    status: str
    name: str
    detail: str

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status={self.status!r} is not one of {STATUSES}")

    def line(self) -> str:
        """The printed line, e.g. `[ ok ] torch: 2.13.0 (>= 2.5)`."""
        return f"[{self.status:^4}] {self.name}: {self.detail}"


def parse_version(text: str) -> tuple[int, ...]:
    """Leading numeric release of a version string: '2.13.0+cpu' -> (2, 13, 0), '8.1.9' -> (8, 1, 9)."""
    if not isinstance(text, str):
        raise TypeError(f"version must be a str, got {type(text).__name__}")
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", text)
    if match is None:
        raise ValueError(f"version={text!r} does not start with a release number like 2.5.1")
    return tuple(int(part) for part in match.group(1).split("."))


def installed_version(dist: str) -> str | None:
    """The installed version of distribution `dist`, or None when it is not installed."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _floor(floor: tuple[int, ...]) -> str:
    return ".".join(map(str, floor))


def check_python() -> Check:
    """Python itself against the floor."""
    have = sys.version_info[:3]
    text = ".".join(map(str, have))
    if have[:2] >= PYTHON_FLOOR:
        return Check("ok", "Python", f"{text} (>= {_floor(PYTHON_FLOOR)})")
    return Check("FAIL", "Python", f"{text}: the lessons need Python >= {_floor(PYTHON_FLOOR)}")


def check_package(dist: str, floor: tuple[int, ...]) -> Check:
    """A required package: installed and at least `floor`."""
    version = installed_version(dist)
    if version is None:
        return Check("FAIL", dist, f"not installed; `pip install '{dist}>={_floor(floor)}'`")
    try:
        ok = parse_version(version) >= floor
    except ValueError:
        ok = False
    if ok:
        return Check("ok", dist, f"{version} (>= {_floor(floor)})")
    return Check("FAIL", dist, f"{version} is too old; the lessons need {dist} >= {_floor(floor)}")


def check_optional(dist: str, why: str) -> Check:
    """An optional package: a warning, never a failure, when it is missing."""
    version = installed_version(dist)
    if version is None:
        return Check("warn", dist, f"not installed (optional: {why})")
    return Check("ok", dist, f"{version} (optional: {why})")


def check_frameworks() -> list[Check]:
    """Transformers, Accelerate and Lightning: optional, but an installed one must run with this torch.

    Each installed framework is imported as lesson 10 imports it (`helpers.frameworks.installed.unusable`), so
    a release that refuses this torch (Transformers 5.20 and later below torch 2.6) is a warning
    that says so, not a crash in the lesson.
    """
    from helpers.frameworks import installed

    checks = []
    for name, version in installed.versions().items():
        if version is None:
            checks.append(Check("warn", name, f"not installed (optional: {FRAMEWORKS_WHY})"))
        elif (why := installed.unusable(name)) is not None:
            checks.append(Check("warn", name, why))
        else:
            checks.append(Check("ok", name, f"{version} (optional: {FRAMEWORKS_WHY})"))
    return checks


def on_colab() -> bool:
    """True inside a Google Colab runtime."""
    return "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ


def check_lessons() -> list[Check]:
    """CUDA and GPU, the device and scale the lessons would pick (and why), the memory method."""
    try:
        import torch

        from helpers.core import device as dev
    except ImportError as exc:  # torch missing: already a FAIL line above
        return [Check("FAIL", "lessons", f"cannot import the helpers: {exc}")]
    checks = []
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        checks.append(Check("info", "CUDA", f"{props.name}, {props.total_memory / dev.GB:.1f} GB = "
                                            f"{props.total_memory / 2**30:.1f} GiB (torch built with CUDA "
                                            f"{torch.version.cuda})"))
    else:
        checks.append(Check("info", "CUDA", "no CUDA GPU visible: the lessons run on the CPU "
                                            "(fine; every measurement has a CPU method)"))
    try:
        device = dev.pick_device()
        scale, why = dev.pick_scale(device)
    except (ValueError, RuntimeError) as exc:
        return [*checks, Check("FAIL", "device and scale", str(exc))]
    checks.append(Check("info", "device", str(device)))
    checks.append(Check("info", "scale", f"{scale} ({why})"))
    cap = dev.gpu_memory_cap_gb() if device.type == "cuda" else None
    if cap is not None:
        checks.append(Check("info", "memory cap", f"{cap:g} GB (LESSONS_GPU_MEMORY_GB): caps the caching "
                                                  "allocator only; a real card that size also holds the "
                                                  "CUDA context"))
    checks.append(Check("info", "memory method", dev.memory_method(device)))
    return checks


def run_checks() -> list[Check]:
    """Every check, in the order printed."""
    checks = [check_python()]
    checks += [check_package(dist, floor) for dist, floor in REQUIRED.items()]
    checks += [check_optional(dist, why) for dist, why in OPTIONAL.items()]
    checks.append(Check("info", "Colab", "yes: the setup cell installs the helpers with --no-deps"
                        if on_colab() else "no"))
    if all(c.status != "FAIL" for c in checks if c.name == "torch"):
        checks += check_frameworks()
        checks += check_lessons()
    return checks


def main(argv: list[str] | None = None) -> int:
    """Print the report; return 1 when any required check failed, else 0."""
    if argv:
        print(f"usage: python -m helpers.env_check (no arguments), got {argv}", file=sys.stderr)
        return 2
    checks = run_checks()
    for check in checks:
        print(check.line())
    failed = [c.name for c in checks if c.status == "FAIL"]
    if failed:
        print(f"NOT READY: fix {', '.join(failed)} (see the README's troubleshooting section)")
        return 1
    print("READY: every required piece is there")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
