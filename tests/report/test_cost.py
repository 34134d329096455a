"""Price table, price choice and cost arithmetic (report/cost.py), and where settings use them.
Pure Python: no engine runs here."""

import math

import pytest

from neuron_batch.device.hardware import INSTANCES
from neuron_batch.report.cost import (
    PRICES,
    PricingError,
    has_builtin_price,
    no_price_message,
    per_million,
    price_for,
    report_cost,
    run_cost,
    usd,
)
from neuron_batch.settings import RunSettings, SettingsError


def test_every_simulated_inf2_trn1_instance_and_trn1_2xlarge_has_both_prices():
    for name in [n for n in INSTANCES if not n.startswith("trn2")] + ["trn1.2xlarge"]:
        assert set(PRICES[name]) == {"on-demand", "reserved"}
        assert PRICES[name]["reserved"] < PRICES[name]["on-demand"]
    # trn2: no price in the sources the project has (../shared/notes/prices.md)
    assert not has_builtin_price("trn2.48xlarge") and not has_builtin_price("trn2.3xlarge")


def test_price_choice_and_override():
    assert price_for("inf2.48xlarge").per_hour_usd == 12.9813
    assert price_for("Inf2.48xlarge", "reserved").per_hour_usd == 5.608
    custom = price_for("inf2.48xlarge", "reserved", price_per_hour=4.0)
    assert (custom.per_hour_usd, custom.pricing, custom.source) == (4.0, "custom",
                                                                    "--price-per-hour")
    assert price_for("trn2.48xlarge", price_per_hour=30).per_hour_usd == 30.0


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan, True])
def test_price_override_must_be_a_positive_number(bad):
    with pytest.raises(PricingError, match="--price-per-hour"):
        price_for("inf2.xlarge", price_per_hour=bad)


def test_unknown_instance_without_price_names_the_option():
    with pytest.raises(PricingError, match=r"'trn2\.48xlarge'.*--price-per-hour"):
        price_for("trn2.48xlarge")
    with pytest.raises(PricingError, match="--pricing"):
        price_for("inf2.xlarge", "spot")


def test_arithmetic():
    price = price_for("inf2.24xlarge")      # 6.4906 USD/h
    assert usd(2.0, price, 3) == pytest.approx(2.0 * 6.4906 * 3)
    assert per_million(5.0, 2_000_000) == pytest.approx(2.5)
    assert per_million(5.0, 0) is None
    cost = run_cost(price, elapsed_s=5400, output_tokens=1_000_000, total_tokens=4_000_000,
                    num_instances=2)
    assert cost["usd"] == pytest.approx(1.5 * 6.4906 * 2)
    assert cost["usd_per_million_output_tokens"] == pytest.approx(1.5 * 6.4906 * 2)
    assert cost["usd_per_million_total_tokens"] == pytest.approx(1.5 * 6.4906 * 2 / 4)
    assert {k: cost[k] for k in ("instance", "num_instances", "pricing", "price_per_hour_usd")} \
        == {"instance": "inf2.24xlarge", "num_instances": 2, "pricing": "on-demand",
            "price_per_hour_usd": 6.4906}
    report = {"throughput": {"elapsed_s": 3600.0}, "tokens": {"output": 10, "total": 40}}
    assert report_cost(report, price)["usd"] == pytest.approx(6.4906)


def test_settings_price_the_simulated_instance_or_a_given_host_instance():
    sim = RunSettings.of(inputs=("x",), device="sim", instance="inf2.xlarge")
    assert sim.price().per_hour_usd == 0.7582
    # on a real host, only an --instance the user gave is priced
    assert RunSettings.of(inputs=("x",), device="neuron").price() is None
    host = RunSettings.of(inputs=("x",), device="neuron",
                       pricing="reserved", host_instance="trn1.2xlarge")
    assert host.price().per_hour_usd == 0.512
    cpu = RunSettings.of(inputs=("x",), device="cpu", host_instance="nothing.known")
    assert cpu.validate().price() is None
    # an instance without a built-in price runs without a cost; a bad price is still refused
    trn2 = RunSettings.of(inputs=("x",), device="sim", instance="trn2.48xlarge")
    assert trn2.validate().price() is None
    priced = trn2.replace(price_per_hour=30.0)
    assert priced.validate().price().per_hour_usd == 30.0
    with pytest.raises(SettingsError, match="--price-per-hour"):
        trn2.replace(price_per_hour=-1.0).validate()


def test_an_unpriced_instance_is_reported_without_a_cost_and_says_how_to_add_one():
    from neuron_batch.report.summary import format_summary

    text = format_summary({"cost_missing": no_price_message("trn2.48xlarge")})
    line = next(line for line in text.splitlines() if line.startswith("Cost"))
    assert "trn2.48xlarge" in line and "--price-per-hour" in line


def test_summary_shows_the_cost():
    from neuron_batch.report.summary import format_summary

    cost = run_cost(price_for("inf2.48xlarge"), elapsed_s=3600, output_tokens=2_000_000,
                    total_tokens=3_000_000, num_instances=2)
    text = format_summary({"cost": cost})
    line = next(line for line in text.splitlines() if line.startswith("Cost"))
    assert "$25.96" in line and "2 x inf2.48xlarge" in line and "$12.9813/h (on-demand)" in line
    assert "$12.981 per M output tok" in line
    assert not any(line.startswith("Cost") for line in format_summary({}).splitlines())


def test_a_simulated_layout_is_billed_for_all_its_instances():
    from neuron_batch.run.folder_report import num_instances

    layout = RunSettings.of(inputs=("x",), device="sim", replicas=6,
                         instance="inf2.48xlarge", num_instances=2)
    assert num_instances(layout) == 2
    assert num_instances(RunSettings.of(inputs=("x",), device="neuron")) == 1
