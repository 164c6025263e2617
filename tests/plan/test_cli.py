"""Tests of the command `python -m helpers.plan`: errors, JSON, tables, Hugging Face configs."""

from __future__ import annotations

import json

import pytest

from helpers.plan import cli


@pytest.mark.parametrize(("argv", "msg"), [
    (["--preset", "gpt5"], "unknown preset"),
    (["--model", "nowhere.at_all:f", "--input-shape", "3", "--num-classes", "2"], "cannot import"),
    (["--preset", "gpt2-small", "--budget", "lots"], "cannot parse budget"),
    (["--model", "helpers.plan.presets:example_classifier"], "describe the batch"),
])
def test_cli_errors_are_clear(argv: list[str], msg: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    assert msg in capsys.readouterr().err


def test_cli_json_for_a_classifier(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--model", "helpers.plan.presets:example_classifier", "--input-shape", "3,32,32",
                      "--num-classes", "10", "--budget", "20 MiB", "--effective-batch", "16", "--json",
                      "--target", "cpu"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plan"]["micro_batch"] * out["plan"]["accumulation_steps"] == 16
    assert out["plan"]["predicted_peak_bytes"] <= 20 * 2**20
    assert set(out["step_at_micro_batch_1"]["plain"]["phases"]) == {"end of forward", "backward peak",
                                                                    "optimizer step peak"}


def test_cli_table_for_a_preset_that_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--preset", "gpt2-small", "--seq-len", "128", "--budget", "1GB"]) == 0
    out = capsys.readouterr().out
    assert "NO PLAN" in out and "floor" in out and "weights only" in out
    assert "16% of 1.0 GiB" in out  # the margin as a share of what the card reports
    assert "note: mixed precision" in out and "16 B/param" in out  # a note, not a saving
    assert "Kahan" in out and "per-rank peak" in out


def test_hf_config(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: ANN001
    pytest.importorskip("transformers")
    config = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 128,
              "n_positions": 64}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert cli.main(["--hf-config", str(path), "--seq-len", "32", "--json", "--budget", "1GB"]) == 0
    assert json.loads(capsys.readouterr().out)["parameters"] > 0


def test_a_preset_command_is_planned_once_and_nothing_else_is_kept(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The same `--preset` command again (lesson 00: the table, then --json) reuses its plan; any other
    setting, or a `--model` factory (user code that may change), is planned afresh."""
    class Report:
        def table(self) -> str:
            return "TABLE"

        def to_dict(self) -> dict:
            return {"plan": None}

    runs: list[dict] = []

    def run(args: object) -> tuple[tuple[str, ...], Report]:
        runs.append(vars(args).copy())
        return ("source",), Report()

    monkeypatch.setattr(cli, "_run", run)
    cli._preset_run.cache_clear()
    try:
        command = ["--preset", "gpt2-small", "--seq-len", "256", "--budget", "8GiB"]
        assert cli.main(command) == 0 and cli.main([*command, "--json"]) == 0
        assert len(runs) == 1 and "json" not in runs[0] and runs[0]["budget"] == "8GiB"
        assert cli.main([*command[:-1], "4GiB"]) == 0 and cli.main([*command, "--precision", "bf16"]) == 0
        assert [r["budget"] for r in runs] == ["8GiB", "4GiB", "8GiB"] and runs[-1]["precision"] == "bf16"
        model = ["--model", "helpers.plan.presets:example_classifier", "--input-shape", "3,8,8",
                 "--num-classes", "2"]
        assert cli.main(model) == 0 and cli.main(model) == 0 and len(runs) == 5
        out = capsys.readouterr().out
        assert out.count("TABLE") == 5 and out.count('"plan": null') == 1
    finally:
        cli._preset_run.cache_clear()
