"""What a run costs: the built-in price table, choosing a price, and the arithmetic.

Pure Python (no vLLM): `neuron-batch run`, `bench` and `plan` all price through here.

Prices are USD per instance-hour. Where they come from (copied from the project's shared
notes, `prices.md`, in 2026; prices differ by region and change, so `--price-per-hour`
overrides them):

- `on-demand`: AWS's public EC2 on-demand price list for us-east-1, Linux, as commonly quoted
  in 2024-2025; not re-checked against AWS since.
- `reserved`: the "RI-Effective hourly rate" column of the AWS Neuron documentation's inference
  performance pages (the pages that publish the inf2 / trn1 throughput figures the simulator is
  calibrated on), which AWS uses there to compute cost per million tokens.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from neuron_batch.choices import Pricing
from neuron_batch.report.model import Report, as_report
from neuron_batch.report.schema import or_none

ON_DEMAND, RESERVED = Pricing.ON_DEMAND, Pricing.RESERVED
PRICINGS = Pricing.values()
DEFAULT_PRICING = ON_DEMAND

#: USD per instance-hour: instance -> {pricing -> price}.
PRICES: dict[str, dict[str, float]] = {
    "inf2.xlarge": {ON_DEMAND: 0.7582, RESERVED: 0.328},
    "inf2.8xlarge": {ON_DEMAND: 1.9679, RESERVED: 0.850},
    "inf2.24xlarge": {ON_DEMAND: 6.4906, RESERVED: 2.804},
    "inf2.48xlarge": {ON_DEMAND: 12.9813, RESERVED: 5.608},
    "trn1.2xlarge": {ON_DEMAND: 1.3438, RESERVED: 0.512},
    "trn1.32xlarge": {ON_DEMAND: 21.50, RESERVED: 8.197},
}
#: Where each column comes from, and when (also in the README).
PRICE_SOURCES: dict[str, str] = {    # (keyed by Pricing, a str: --pricing's word finds it)
    ON_DEMAND: "AWS EC2 on-demand price list, us-east-1, Linux, as quoted in 2024-2025",
    RESERVED: "AWS Neuron documentation, inference performance pages, "
              "'RI-Effective hourly rate' column",
}
OVERRIDE_SOURCE = "--price-per-hour"


class PricingError(ValueError):
    """No price can be found for an instance; the message names the option that gives one."""


@dataclass(frozen=True)
class Price:
    """The hourly price of one instance and where it came from."""

    instance: str
    pricing: str                 # "on-demand" | "reserved" | "custom" (--price-per-hour)
    per_hour_usd: float
    source: str


def check_pricing(pricing: str) -> str:
    if pricing not in PRICINGS:
        raise PricingError(f"--pricing must be one of {', '.join(PRICINGS)}, got {pricing!r}")
    return pricing


def check_price_per_hour(value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value > 0):
        raise PricingError(f"--price-per-hour must be a positive number of USD, got {value!r}")
    return float(value)


def has_builtin_price(instance: str) -> bool:
    return instance.strip().lower() in PRICES


def no_price_message(instance: str) -> str:
    """What the report and summary say when a run's instance has no price."""
    return f"none: no built-in price for {instance}; give --price-per-hour USD"


def price_for(instance: str, pricing: str = DEFAULT_PRICING,
              price_per_hour: float | None = None) -> Price:
    """The price of `instance` under `pricing`, or the `--price-per-hour` override.

    Raises PricingError for an instance the table does not know when no override is given."""
    check_pricing(pricing)
    key = instance.strip().lower()
    override = check_price_per_hour(price_per_hour)
    if override is not None:
        return Price(key, "custom", override, OVERRIDE_SOURCE)
    if key not in PRICES:
        raise PricingError(
            f"no built-in price for instance {instance!r} (priced: {', '.join(PRICES)}); "
            f"give one with --price-per-hour USD")
    return Price(key, pricing, PRICES[key][pricing], PRICE_SOURCES[pricing])


def usd(hours: float, price: Price | float, num_instances: int = 1) -> float:
    """Instance-hours times the hourly price: what `num_instances` instances cost for `hours`."""
    per_hour = price.per_hour_usd if isinstance(price, Price) else float(price)
    return hours * per_hour * num_instances


def per_million(amount_usd: float, tokens: float) -> float | None:
    """USD per million tokens; None when no token was produced."""
    return amount_usd / tokens * 1e6 if tokens else None


def run_cost(price: Price, *, elapsed_s: float, output_tokens: int, total_tokens: int,
             num_instances: int = 1) -> dict[str, Any]:
    """The `cost` section of a report: run time x price x instances, and per million tokens.

    Compile time is not included (a run does not know whether its graphs were cached); `plan`
    adds the estimate for the graphs it would compile."""
    hours = max(float(elapsed_s), 0.0) / 3600.0
    amount = usd(hours, price, num_instances)
    return {
        "instance": price.instance,
        "num_instances": int(num_instances),
        "pricing": price.pricing,
        "price_per_hour_usd": price.per_hour_usd,
        "price_source": price.source,
        "hours": hours,
        "usd": amount,
        "usd_per_million_output_tokens": per_million(amount, output_tokens),
        "usd_per_million_total_tokens": per_million(amount, total_tokens),
    }


def report_cost(report: Report | Mapping[str, Any], price: Price, num_instances: int = 1
                ) -> dict[str, Any]:
    """`run_cost` from a run report's throughput and token figures."""
    report = as_report(report)
    tokens = report.section("tokens")
    return run_cost(price, elapsed_s=report.section("throughput").elapsed_s or 0.0,
                    output_tokens=tokens.output or 0,
                    total_tokens=tokens.total or 0, num_instances=num_instances)


# -- compile ------------------------------------------------------------------------------
#: The report key of an estimated compile time (the simulated device's, a split run's).
COMPILE_S = "estimated_compile_s"


def compile_and_usd(report: Report | Mapping[str, Any]) -> tuple[float | None, float | None]:
    """(estimated compile seconds, run + compile USD) of a run's report; a run split by
    length (layout/split.py) compiles both its layouts. The compile is billed on every
    instance: each compiles before it runs."""
    report = as_report(report)
    compile_s = (report.split or {}).get(COMPILE_S)
    if compile_s is None:
        compile_s = _estimated_compile_s(report.section("config").to_dict())
    cost = report.section("cost")
    run_usd = or_none(cost.usd)
    if run_usd is None or compile_s is None or not cost.price_per_hour_usd:
        return compile_s, None
    return compile_s, run_usd + (compile_s / 3600.0 * cost.price_per_hour_usd
                                 * (cost.num_instances or 1))


def _estimated_compile_s(config: Mapping[str, Any]) -> float | None:
    sim = config.get("sim")
    if isinstance(sim, Mapping):
        for key in ("compile", "compile_footprint"):
            footprint = sim.get(key)
            if isinstance(footprint, Mapping) and footprint.get(COMPILE_S) is not None:
                return float(footprint[COMPILE_S])
        if sim.get(COMPILE_S) is not None:
            return float(sim[COMPILE_S])
    value = config.get(COMPILE_S)
    return None if value is None else float(value)
