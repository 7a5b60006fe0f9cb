"""Run a schedule of target positions through NautilusTrader's backtest engine (`make replay`).

The only module of marketrl that imports ``nautilus_trader`` (the optional ``replay`` extra), and only inside
`run_nautilus`, so the package imports without it. It knows nothing of marketrl's accounting: it takes price
events, the contract specs and a target position per (contract, time), and returns Nautilus's own fills and its
account's result.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

VENUE = "GLBX"
STARTING_BALANCE = (
    100_000_000.0  # an account that never runs out of margin: the replay checks PnL, not margin
)


class ReplayEngineError(RuntimeError):
    """NautilusTrader is missing, or it refused or did not fill an order of the schedule."""


@dataclass(frozen=True)
class Contract:
    """One contract as Nautilus sees it: its name, tick size, point value (multiplier) and currency."""

    name: str
    tick_size: float
    point_value: float
    currency: str


@dataclass(frozen=True)
class PriceEvent:
    """One price event of a contract at ``ts_ns`` (UTC ns): a bar (open/high/low/close) or a quote (bid/ask)."""

    instrument_id: int
    ts_ns: int
    open: float = 0.0
    high: float = 0.0
    low: float = 0.0
    close: float = 0.0
    bid: float = 0.0
    ask: float = 0.0


@dataclass(frozen=True)
class Fill:
    """One of Nautilus's fills: signed quantity (contracts), price and commission (currency) at ``ts_ns``."""

    instrument_id: int
    ts_ns: int
    quantity: float
    price: float
    commission: float


@dataclass(frozen=True)
class EngineResult:
    """Nautilus's fills, and its account: balance change, unrealized PnL of open positions at the last prices."""

    fills: list[Fill]
    balance_change: float
    unrealized: float
    orders: int

    @property
    def total(self) -> float:
        """Nautilus's own total PnL: the account's balance change plus the open positions' unrealized PnL."""
        return self.balance_change + self.unrealized


def _precision(tick: float) -> int:
    text = f"{Decimal(str(tick)).normalize():f}"
    return len(text.split(".")[1]) if "." in text else 0


def nautilus_version() -> str | None:
    """The installed NautilusTrader version, or None where the ``replay`` extra is not installed."""
    try:
        import nautilus_trader
    except ImportError:
        return None
    return str(nautilus_trader.__version__)


def run_nautilus(
    contracts: Mapping[int, Contract],
    events: Sequence[PriceEvent],
    schedule: Mapping[tuple[int, int], float],
    *,
    quotes: bool,
    fees: Mapping[tuple[int, int], float],
) -> EngineResult:
    """Replay ``schedule`` ((instrument_id, ts_ns) -> target contracts, reached with one market order at that
        event) over ``events`` (time-ordered) in a NautilusTrader ``BacktestEngine``; ``fees`` has the commission per
    contract (currency) of the order at each scheduled (instrument_id, ts_ns).

        ``quotes`` False: the events are 1-minute bars and a market order fills at the bar's close (Nautilus's bar
        execution on an L1 book); True: the events are quotes and a buy fills at the ask, a sell at the bid. Each fill
        pays its order's fee per contract through a fee model. Every scheduled order must fill at
        its event, else a ReplayEngineError.
    """
    try:
        from nautilus_trader.backtest.engine import BacktestEngine, BacktestEngineConfig
        from nautilus_trader.backtest.models import FeeModel, FillModel
        from nautilus_trader.config import LoggingConfig, StrategyConfig
        from nautilus_trader.model.currencies import Currency
        from nautilus_trader.model.data import Bar, BarSpecification, BarType, QuoteTick
        from nautilus_trader.model.enums import (
            AccountType,
            AggregationSource,
            AssetClass,
            BarAggregation,
            OmsType,
            OrderSide,
            PriceType,
        )
        from nautilus_trader.model.identifiers import InstrumentId, Symbol, Venue
        from nautilus_trader.model.instruments import FuturesContract
        from nautilus_trader.model.objects import Money, Price, Quantity
        from nautilus_trader.trading.strategy import Strategy
    except ImportError as exc:
        raise ReplayEngineError(
            f"NautilusTrader is not installed ({exc.name}); `make replay` installs the replay extra"
        ) from exc

    venue = Venue(VENUE)
    by_name: dict[str, int] = {}
    instruments: dict[int, Any] = {}
    currencies: set[str] = set()
    for iid, spec in contracts.items():
        precision = _precision(spec.tick_size)
        nid = InstrumentId(Symbol(spec.name), venue)
        instruments[iid] = FuturesContract(
            instrument_id=nid,
            raw_symbol=Symbol(spec.name),
            asset_class=AssetClass.INDEX,
            currency=Currency.from_str(spec.currency),
            price_precision=precision,
            price_increment=Price(spec.tick_size, precision),
            multiplier=Quantity.from_str(f"{Decimal(str(spec.point_value)).normalize():f}"),
            lot_size=Quantity.from_int(1),
            underlying=spec.name,
            activation_ns=0,
            expiration_ns=2**63 - 1,
            ts_event=0,
            ts_init=0,
            margin_init=Decimal(0),
            margin_maint=Decimal(0),
        )
        by_name[str(nid)] = iid
        currencies.add(spec.currency)
    if len(currencies) != 1:
        raise ReplayEngineError(f"contracts: one currency expected, got {sorted(currencies)}")
    currency = Currency.from_str(currencies.pop())

    class _ScheduledFee(FeeModel):  # type: ignore[misc]  # per contract, the fee of the order's own instant
        def get_commission(self, order: Any, fill_qty: Any, fill_px: Any, instrument: Any) -> Any:
            key = (by_name[str(instrument.id)], int(order.ts_init))
            if key not in fees:
                raise ReplayEngineError(f"no fee for the order of {instrument.id} at ts {order.ts_init}")
            return Money(fees[key] * float(fill_qty), currency)

    bar_types = {
        iid: BarType(
            inst.id, BarSpecification(1, BarAggregation.MINUTE, PriceType.LAST), AggregationSource.EXTERNAL
        )
        for iid, inst in instruments.items()
    }
    data: list[Any] = []
    for event in events:
        inst = instruments[event.instrument_id]
        if quotes:
            data.append(
                QuoteTick(
                    inst.id,
                    inst.make_price(event.bid),
                    inst.make_price(event.ask),
                    Quantity.from_int(1_000_000),
                    Quantity.from_int(1_000_000),
                    event.ts_ns,
                    event.ts_ns,
                )
            )
        else:
            data.append(
                Bar(
                    bar_types[event.instrument_id],
                    inst.make_price(event.open),
                    inst.make_price(event.high),
                    inst.make_price(event.low),
                    inst.make_price(event.close),
                    Quantity.from_int(1_000_000),
                    event.ts_ns,
                    event.ts_ns,
                )
            )

    fills: list[Fill] = []
    submitted: list[tuple[int, int]] = []
    refused: list[str] = []
    targets = dict(schedule)

    class _Replay(Strategy):  # type: ignore[misc]
        def on_start(self) -> None:
            for iid, inst in instruments.items():
                if quotes:
                    self.subscribe_quote_ticks(inst.id)
                else:
                    self.subscribe_bars(bar_types[iid])

        def _act(self, nid: Any, ts_ns: int) -> None:
            iid = by_name[str(nid)]
            target = targets.get((iid, ts_ns))
            if target is None:
                return
            delta = Decimal(str(target)) - self.portfolio.net_position(nid)
            if delta == 0:
                return
            side = OrderSide.BUY if delta > 0 else OrderSide.SELL
            if delta != delta.to_integral_value():
                raise ReplayEngineError(f"target {target} of {nid}: whole contracts only")
            order = self.order_factory.market(nid, side, Quantity.from_int(int(abs(delta))))
            submitted.append((iid, ts_ns))
            self.submit_order(order)

        def on_bar(self, bar: Any) -> None:
            self._act(bar.bar_type.instrument_id, bar.ts_event)

        def on_quote_tick(self, tick: Any) -> None:
            self._act(tick.instrument_id, tick.ts_event)

        def on_order_denied(self, event: Any) -> None:
            refused.append(str(event.reason))

        def on_order_rejected(self, event: Any) -> None:
            refused.append(str(event.reason))

        def on_order_filled(self, event: Any) -> None:
            sign = 1.0 if event.order_side == OrderSide.BUY else -1.0
            fills.append(
                Fill(
                    instrument_id=by_name[str(event.instrument_id)],
                    ts_ns=int(event.ts_event),
                    quantity=sign * float(event.last_qty),
                    price=float(event.last_px),
                    commission=float(event.commission.as_double()),
                )
            )

    engine = BacktestEngine(
        config=BacktestEngineConfig(logging=LoggingConfig(bypass_logging=True, log_level="ERROR"))
    )
    try:
        engine.add_venue(
            venue=venue,
            oms_type=OmsType.NETTING,
            account_type=AccountType.MARGIN,
            base_currency=currency,
            starting_balances=[Money(STARTING_BALANCE, currency)],
            fill_model=FillModel(prob_fill_on_limit=1.0, prob_slippage=0.0, random_seed=0),
            fee_model=_ScheduledFee(),
            bar_execution=not quotes,
        )
        for inst in instruments.values():
            engine.add_instrument(inst)
        engine.add_data(data)
        engine.add_strategy(_Replay(config=StrategyConfig(strategy_id="Replay-001")))
        with warnings.catch_warnings():  # Nautilus 1.221 calls pandas' deprecated Timestamp.utcnow
            warnings.filterwarnings("ignore", message=".*utcnow.*")
            engine.run()
        account = engine.portfolio.account(venue)
        balance = float(account.balance_total(currency).as_double())
        unrealized = 0.0
        for inst in instruments.values():
            pnl = engine.portfolio.unrealized_pnl(inst.id)
            unrealized += float(pnl.as_double()) if pnl is not None else 0.0
    finally:
        engine.dispose()
    filled = {(f.instrument_id, f.ts_ns) for f in fills}
    unfilled = [key for key in submitted if key not in filled]
    if unfilled:
        iid, ts_ns = unfilled[0]
        raise ReplayEngineError(
            f"NautilusTrader did not fill {len(unfilled)} of {len(submitted)} orders at their event "
            f"(first: {contracts[iid].name} at ts {ts_ns}{': ' + refused[0] if refused else ''})"
        )
    return EngineResult(
        fills=fills, balance_change=balance - STARTING_BALANCE, unrealized=unrealized, orders=len(submitted)
    )
