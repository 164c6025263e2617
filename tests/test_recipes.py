"""Every Transformers checkpointing recipe the course shows runs, as shown (issue 37).

The recipes are collected from README.md and the Markdown of every notebook: each ```python block,
and each inline code span, that spells a Transformers checkpointing knob (`gradient_checkpointing*`
or `activation_checkpointing*`). A block runs as written, in a scratch folder, beside a small Llama
built from a config in code (random weights, nothing downloaded) called `model`. Whatever it builds is
then trained for one update: `args` (a `TrainingArguments`) drives a real `Trainer`; a switch thrown
on `model` runs one forward and backward. So a kwargs dict that only fails at the first forward
(a `context_fn` without `"use_reentrant": False`, the recipe issue 37 found) fails here. Inline spans
go through the same runner: `TrainingArguments(...)` and `model.<switch>(...)` as written, a keyword
fragment (`activation_checkpointing=True`) as `TrainingArguments(<fragment>)`, a kwargs dict as the
switch's `activation_checkpointing_kwargs`; `...` in a span stands for lesson 02's selective policy.

The deprecation warning is a test too: the names taught as current raise no FutureWarning or
DeprecationWarning, and the old names warn and point to the new ones, so the next rename (or the
removal in v6) fails here before a learner meets it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import warnings
from pathlib import Path

import pytest

from helpers.frameworks import hf_models, installed

ROOT = Path(__file__).resolve().parent.parent
CI = os.environ.get("CI", "").lower() == "true"
needs_hf = pytest.mark.skipif(bool(installed.missing("transformers", "accelerate")) and not CI,
                              reason="needs the frameworks extra (transformers, accelerate)")
KNOB = re.compile(r"(gradient|activation)_checkpointing")
CONTEXT_FN = re.compile(r"""context_fn["']?\s*[:=]""")  # a context_fn passed, not just named
OLD_NAMES = re.compile(r"\bgradient_checkpointing")  # Transformers 5.23 deprecated these ("removed in v6")
SIZES = dict(vocab_size=48, hidden=24, layers=4, heads=2, max_len=12)


# -- collecting what the course shows ----------------------------------------------------------
def _markdown_sources() -> list[tuple[str, str]]:
    sources = [("README.md", (ROOT / "README.md").read_text(encoding="utf-8"))]
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] == "markdown":
                sources.append((f"{path.name}#{cell['id']}", "".join(cell["source"])))
    return sources


def recipes() -> list[tuple[str, str, str]]:
    """(where, "block" or "span", code) for every recipe shown."""
    out = []
    for where, text in _markdown_sources():
        for block in re.findall(r"```python\n(.*?)```", text, re.S):
            if KNOB.search(block):
                out.append((where, "block", block))
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        for span in re.findall(r"`([^`\n]+)`", prose):
            if (KNOB.search(span) or CONTEXT_FN.search(span)) and "/" not in span:  # not a file's path
                out.append((where, "span", span))
    return out


RECIPES = recipes()
IDS = [f"{where}:{kind}:{code[:50]}" for where, kind, code in RECIPES]


def test_the_course_shows_recipes_where_the_issue_found_them() -> None:
    places = {where.split("#")[0] for where, _, _ in RECIPES}
    assert {"README.md", "00_start_here.ipynb", "10_frameworks_and_compiler.ipynb"} <= places, places
    assert sum(kind == "block" for _, kind, _ in RECIPES) >= 3


@pytest.mark.parametrize(("where", "kind", "code"), RECIPES, ids=IDS)
def test_a_context_fn_is_always_shown_with_use_reentrant_false(where: str, kind: str, code: str) -> None:
    """Transformers' kwargs dict replaces its own {"use_reentrant": False}: without it torch raises."""
    if CONTEXT_FN.search(code):
        assert re.search(r"""["']?use_reentrant["']?\s*[:=]\s*False""", code), (where, code)


# -- running them --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hf():
    installed.timed_import("transformers")
    from helpers.frameworks import hf as module

    return module


def _policy() -> object:
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    from helpers.techniques.saved_tensors import save_matmul_outputs

    return functools.partial(create_selective_checkpoint_contexts, save_matmul_outputs)


def _program(kind: str, code: str) -> str:
    """The Python that runs a recipe as shown (an inline span gets the one line it needs)."""
    if kind == "block":
        return code
    code = code.replace("...", "_policy()")
    if code.startswith("TrainingArguments("):
        return f"from transformers import TrainingArguments\nargs = {code}"
    if code.startswith("{"):
        return f"model.activation_checkpointing_enable(activation_checkpointing_kwargs={code})"
    if re.fullmatch(r"(model\.)?\w+_checkpointing_(enable|disable)\(.*\)", code):
        return code if code.startswith("model.") else f"model.{code}"
    if re.match(r"\w+\s*=", code):
        return f"from transformers import TrainingArguments\nargs = TrainingArguments({code})"
    return ""  # a bare name: checked by test_every_name_shown_exists


def _train_one_update(hf, args: object, model: object, tmp_path: Path) -> None:
    import transformers

    from helpers.techniques.token_loss import variable_length_sequences

    if not args.activation_checkpointing and args.activation_checkpointing_kwargs:
        args = dataclasses.replace(args, activation_checkpointing=True)  # a kwargs fragment shown alone
    batch, k = args.per_device_train_batch_size, args.gradient_accumulation_steps
    args = dataclasses.replace(args, output_dir=str(tmp_path / "out"), max_steps=1, use_cpu=True,
                               report_to="none", save_strategy="no", logging_strategy="no",
                               disable_tqdm=True, dataloader_num_workers=0)
    samples = variable_length_sequences(batch * k, SIZES["max_len"], SIZES["vocab_size"], spread=0.5, seed=1)
    rows = hf_models.training_rows(samples)
    trainer = hf.quiet(transformers.Trainer(model=model, args=args, train_dataset=rows,
                                            data_collator=hf_models.collate))
    trainer.train()
    assert trainer.state.global_step == 1
    assert model.is_activation_checkpointing == bool(args.activation_checkpointing)


@pytest.mark.slow  # a Trainer update per recipe: `make test`, not `make check`
@needs_hf
@pytest.mark.parametrize(("where", "kind", "code"), RECIPES, ids=IDS)
def test_every_recipe_runs_as_shown(hf, where: str, kind: str, code: str, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    program = _program(kind, code)
    if not program:
        pytest.skip(f"{code!r} is a name, not a recipe")
    monkeypatch.chdir(tmp_path)  # a recipe's output_dir, if it names one, lands in the scratch folder
    model = hf_models.causal_lm("llama", **SIZES)
    scope = {"model": model, "_policy": _policy}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(program, where, "exec"), scope)  # noqa: S102 - the course's own recipe, as shown
        if "args" in scope:
            _train_one_update(hf, scope["args"], model, tmp_path)
        elif model.is_activation_checkpointing:  # the switch thrown on the model: one forward and backward
            hf.loss_and_grad(model, hf_models.collate(hf_models.training_rows(_samples())))
    deprecations = [str(w.message) for w in caught if KNOB.search(str(w.message))
                    and issubclass(w.category, (FutureWarning, DeprecationWarning))]
    if not OLD_NAMES.search(code):
        assert not deprecations, (where, code, deprecations)  # taught as current: no warning


def _samples() -> list:
    from helpers.techniques.token_loss import variable_length_sequences

    return variable_length_sequences(4, SIZES["max_len"], SIZES["vocab_size"], spread=0.5, seed=2)


@needs_hf
def test_every_name_shown_exists(hf) -> None:
    import transformers

    fields = transformers.TrainingArguments.__dataclass_fields__
    model_type = transformers.PreTrainedModel
    for where, kind, code in RECIPES:
        if kind == "span":
            for name in re.findall(r"\b((?:gradient|activation)_checkpointing\w*)", code):
                assert name in fields or hasattr(model_type, name), (where, name)


# -- the deprecation warning, as a test ----------------------------------------------------------
def _warnings_of(fn: object) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [w for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))]


@needs_hf
def test_the_names_taught_as_current_raise_no_deprecation_warning(hf, tmp_path: Path) -> None:
    import transformers

    model = hf_models.causal_lm("llama", **SIZES)

    def current() -> None:
        transformers.TrainingArguments(output_dir=str(tmp_path), activation_checkpointing=True,
                                       activation_checkpointing_kwargs={"every_n_layers": 2})
        model.activation_checkpointing_enable(every_n_layers=2)
        model.activation_checkpointing_disable()

    assert not _warnings_of(current), [str(w.message) for w in _warnings_of(current)]


@needs_hf
def test_the_old_names_warn_and_name_their_successors(hf, tmp_path: Path) -> None:
    import transformers

    model = hf_models.causal_lm("llama", **SIZES)
    args = _warnings_of(lambda: transformers.TrainingArguments(
        output_dir=str(tmp_path), gradient_checkpointing=True,
        gradient_checkpointing_kwargs={"use_reentrant": False}))
    named = {str(w.message).split("`")[1] for w in args}
    assert named == {"gradient_checkpointing", "gradient_checkpointing_kwargs"}, named
    assert all("activation_checkpointing" in str(w.message) and "v6" in str(w.message) for w in args)
    switch = _warnings_of(lambda: model.gradient_checkpointing_enable(
        gradient_checkpointing_kwargs={"use_reentrant": False}))
    assert any("activation_checkpointing_enable" in str(w.message) for w in switch), switch
