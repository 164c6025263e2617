"""helpers.frameworks.installed: finding, importing, quieting lesson 10's frameworks; the versions that ran.

Under CI=true every framework must be installed (the `frameworks` extra): a missing one fails here,
and lesson 10's other tests run (and fail) instead of skipping.
"""

from __future__ import annotations

import logging
import os
import warnings

import pytest

from helpers.frameworks import installed

CI = os.environ.get("CI", "").lower() == "true"


def test_the_frameworks_are_installed_under_ci(capsys: pytest.CaptureFixture[str]) -> None:
    absent = installed.missing()
    if absent and not CI:
        pytest.skip(f"not installed here: {absent} ({installed.install_hint(absent)})")
    assert not absent, f"CI=true but {absent} are missing: {installed.install_hint(absent)}"
    found = ", ".join(f"{name} {version}" for name, version in installed.versions().items())
    with capsys.disabled():  # shown even under -q: the versions these tests ran with
        print(f"\nlesson 10 frameworks: {found}")


def test_versions_and_missing_agree() -> None:
    found = installed.versions()
    assert set(found) == set(installed.FRAMEWORKS)
    for name in installed.FRAMEWORKS:
        assert (found[name] is None) == (name in installed.not_installed(name)), name
        if found[name] is None:
            assert name in installed.missing(name)


def test_versions_table_names_every_framework() -> None:
    table = installed.versions_table()
    assert "framework" in table and "lightning" in table


def test_unknown_framework_is_refused() -> None:
    with pytest.raises(ValueError, match="framework='tensorflow' is not allowed"):
        installed.missing("tensorflow")
    with pytest.raises(ValueError, match="framework"):
        installed.ready("jax")


def test_ready_skips_with_a_message_and_fails_under_ci(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(installed, "not_installed", lambda *names: ["lightning"])
    monkeypatch.setenv("CI", "false")
    assert installed.ready("lightning") is False
    out = capsys.readouterr().out
    assert out.startswith("Skipped: lightning not installed")
    assert "pip install 'ckpt-vs-accum[frameworks]'" in out
    monkeypatch.setenv("CI", "true")
    with pytest.raises(RuntimeError, match="CI=true.*lightning not installed"):
        installed.ready("lightning")
    monkeypatch.setattr(installed, "not_installed", lambda *names: [])
    monkeypatch.setattr(installed, "unusable", lambda name: None)
    assert installed.ready("lightning") is True


def test_install_hint_names_the_extra_and_the_packages() -> None:
    hint = installed.install_hint(["transformers", "lightning"])
    assert "ckpt-vs-accum[frameworks]" in hint and "pip install transformers lightning" in hint


def test_caught_warnings_records_instead_of_raising() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # as under LESSONS_STRICT=1
        with installed.caught_warnings() as records:
            for _ in range(3):
                warnings.warn("the same notice", FutureWarning, stacklevel=1)
            warnings.warn("x" * 300, UserWarning, stacklevel=1)
    lines = installed.describe_warnings(records, width=40)
    assert lines[0] == "caught FutureWarning (x3): the same notice"
    assert lines[1].startswith("caught UserWarning (x1): ") and lines[1].endswith("...") and len(lines) == 2


def test_offline_sets_the_hub_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(key, raising=False)
    installed.offline()
    assert os.environ["HF_HUB_OFFLINE"] == "1" and os.environ["TRANSFORMERS_OFFLINE"] == "1"


def test_silence_logs_sets_errors_only() -> None:
    logger = logging.getLogger("lightning.pytorch")
    before = logger.level
    try:
        logger.setLevel(logging.INFO)
        installed.silence_logs()
        assert logger.level == logging.ERROR
    finally:
        logger.setLevel(before)


@pytest.mark.skipif(bool(installed.missing("accelerate")) and not CI, reason="accelerate not installed")
def test_timed_import_records_once() -> None:
    module = installed.timed_import("accelerate")
    first = installed.IMPORT_SECONDS["accelerate"]
    assert module.__name__ == "accelerate" and first >= 0
    installed.timed_import("accelerate")
    assert installed.IMPORT_SECONDS["accelerate"] == first


def test_an_installed_framework_that_refuses_this_torch_is_not_ready(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Transformers 5.20+ on torch 2.5 disables its models at import; ready() must say so and skip.

    The refusal is Transformers' own verdict (`is_torch_available()`), stood in for here; the floor
    run of `make test-matrix` meets the real one when it installs a Transformers too new for 2.5.
    """
    import importlib
    import types

    if installed.not_installed("transformers"):
        pytest.skip("needs transformers installed")
    real = importlib.import_module
    refusing = types.SimpleNamespace(is_torch_available=lambda: False)
    def import_module(name: str, *args: object) -> object:
        return refusing if name == "transformers.utils.import_utils" else real(name, *args)

    monkeypatch.setattr(importlib, "import_module", import_module)
    monkeypatch.setattr(installed, "_UNUSABLE", {})
    monkeypatch.setenv("CI", "false")
    assert installed.ready("transformers") is False
    assert installed.missing("transformers") == ["transformers"]  # what the lessons and tests skip on
    out = capsys.readouterr().out
    assert out.startswith("Skipped: transformers ") and "does not run with torch" in out
    assert "disabled its PyTorch models" in out
    monkeypatch.setenv("CI", "true")
    with pytest.raises(RuntimeError, match="CI=true.*does not run with torch"):
        installed.ready("transformers")
    monkeypatch.setattr(installed, "_UNUSABLE", {})
    monkeypatch.setattr(importlib, "import_module", real)
    verdict = real("transformers.utils.import_utils").is_torch_available()  # Transformers' own, here
    assert (installed.unusable("transformers") is None) == verdict
