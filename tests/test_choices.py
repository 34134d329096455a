"""Typed settings: every closed choice of RunSettings is an enumeration member from the moment
the settings are built, whatever spelling it came in; bad values keep their messages; run.json
and reprs read as the plain strings they were; the CLI's choices are the enumerations'. Pure
(no vLLM, no engine)."""

from __future__ import annotations

import click
import pytest
from hypothesis import given
from hypothesis import strategies as st

from neuron_batch.choices import (
    Device,
    KvReserve,
    OnError,
    Order,
    PlacementMode,
    Pricing,
    WeightDtype,
)
from neuron_batch.cli import main
from neuron_batch.settings import (
    RunSettings,
    SettingsError,
)
from neuron_batch.settings.job_file import load_config_file


def test_every_choice_is_its_member_once_built():
    settings = RunSettings.of(inputs=("x",), device="sim", kv_reserve="max-model-len",
                           order="length", on_error="skip", split_placement="in-turn",
                           weight_dtype="int8",
                           pricing="reserved")
    assert settings.device is Device.SIM
    assert settings.kv_reserve is KvReserve.MAX_MODEL_LEN
    assert settings.order is Order.LENGTH
    assert settings.on_error is OnError.SKIP
    assert settings.split_placement is PlacementMode.IN_TURN
    assert settings.weight_dtype is WeightDtype.INT8
    assert settings.pricing is Pricing.RESERVED
    # members still equal the strings the rest of the code compares with
    assert settings.device == "sim" and settings.kv_reserve == "max_model_len"


@given(st.sampled_from(["max_model_len", "max-model-len", "mml", "request", "req"]),
       st.lists(st.booleans(), min_size=13, max_size=13), st.sampled_from(["", " ", "\t"]))
def test_any_spelling_of_a_kv_rule_is_one_member(name, upper, pad):
    """The spellings job files and the scheduler config have always taken: either separator,
    any case, the short names, surrounding blanks."""
    spelled = pad + "".join(c.upper() if u else c for c, u in zip(name, upper)) + pad
    expected = KvReserve.REQUEST if name.startswith("req") else KvReserve.MAX_MODEL_LEN
    built = RunSettings.of(inputs=("x",), device="cpu", kv_reserve=spelled).validate()
    assert built.kv_reserve is expected


def test_a_library_caller_s_dashed_kv_rule_is_the_rule():
    """Issue 32's bug: the dashed spelling stayed a string that the plan bounds did not know."""
    settings = RunSettings.of(inputs=("x",), kv_reserve="max-model-len", device="cpu").validate()
    assert settings.kv_reserve is KvReserve.MAX_MODEL_LEN


@pytest.mark.parametrize("changes, message", [
    ({"device": "tpu"}, "--device must be one of auto, cpu, cuda, neuron, sim, got 'tpu'"),
    ({"order": "shortest"}, "--order must be one of input, length, prefix, got 'shortest'"),
    ({"on_error": "ignore"}, "--on-error must be one of fail, skip, got 'ignore'"),
    ({"split_placement": "apart"},
     "--split-placement must be one of auto, in-turn, side-by-side, got 'apart'"),
    ({"kv_reserve": "all"}, "--kv-reserve must be one of request, max-model-len, got 'all'"),
    ({"device": "sim", "pricing": "spot"},
     "--pricing must be one of on-demand, reserved, got 'spot'"),
])
def test_a_value_that_is_no_choice_keeps_its_message(changes, message):
    settings = RunSettings.of(inputs=("x",), **changes)      # built: refused only by validate()
    with pytest.raises(SettingsError) as error:
        settings.validate()
    assert str(error.value) == message


def test_run_json_and_reprs_read_as_plain_strings():
    settings = RunSettings.of(inputs=("x",), device="sim", kv_reserve="max-model-len",
                           dataset_split="validation", weight_dtype="fp8")
    saved = settings.to_dict()
    assert type(saved["device"]) is str and saved["device"] == "sim"
    assert type(saved["kv_reserve"]) is str and saved["kv_reserve"] == "max_model_len"
    assert type(saved["sim"]["weight_dtype"]) is str and type(saved["pricing"]) is str
    # the data set's split keeps the key run.json always had
    assert saved["split"] == "validation" and "dataset_split" not in saved
    def plain(value):
        if isinstance(value, dict):
            return all(plain(v) for v in value.values())
        if isinstance(value, (tuple, list)):
            return all(plain(v) for v in value)
        return type(value) in (str, int, float, bool, type(None))

    assert plain(saved)
    text = repr(settings)
    assert "device='sim'" in text and "kv_reserve='max_model_len'" in text
    assert "weight_dtype='fp8'" in text


def test_a_job_file_s_split_is_the_data_set_s(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('split = "test"\nkv-reserve = "max-model-len"\n')
    assert load_config_file(job) == {"dataset_split": "test", "kv_reserve": "max-model-len"}
    job.write_text('dataset-split = "test"\n')
    # (the message names the file's line and spells the names as the file does: issue 33)
    with pytest.raises(SettingsError, match=r"job.toml:1: unknown setting 'dataset-split'; "
                                            r"known: .*\bsplit\b"):
        load_config_file(job)


#: Each choice option of the commands, and the enumeration its choices must be.
CHOICE_OPTIONS = {"device": Device, "order": Order, "on_error": OnError,
                  "split_placement": PlacementMode, "weight_dtype": WeightDtype,
                  "pricing": Pricing}


def test_the_command_line_s_choices_are_the_enumerations():
    seen = set()

    def walk(command: click.Command) -> None:
        for sub in getattr(command, "commands", {}).values():
            walk(sub)
        for param in command.params:
            if param.name in CHOICE_OPTIONS:
                kind = CHOICE_OPTIONS[param.name]
                assert isinstance(param.type, click.Choice), (command.name, param.name)
                assert tuple(param.type.choices) == kind.values(), (command.name, param.name)
                assert param.default == next(iter(kind)).value, (command.name, param.name)
                seen.add(param.name)

    walk(main)
    assert seen == set(CHOICE_OPTIONS)
