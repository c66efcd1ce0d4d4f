"""The ``Provider`` contract (``cloud/provider.py``) as plain checks a provider's author runs.

Each check drives one part of the protocol for real, on the provider as its author built it
(against its real API, a test double of it, or machines it reaches): the protocol's methods and
their parameters, offers and a cell's choice among them, a session from create through wait,
SSH details that log in, the watch's question, the sessions a run owns, release (twice) and
cost, and what it answers about a session it does not know. The project's own suite
(``tests/e2e/test_provider_contract.py``) runs these checks on every provider it ships; a
third party's provider passes the same ones::

    from pytest_gpubench.cloud.provider import Constraints
    from pytest_gpubench.run.provider_contract import ProviderUnderTest, check_provider

    subject = ProviderUnderTest(my_provider, Constraints("RTX 4090", "myregion", vram_gb=8))
    await check_provider(subject)          # or one check: await CHECKS["session"](subject)

``wanted`` is what a cell asks that the provider has an offer for. A broken rule raises
:class:`ContractBroken` (an ``AssertionError``: pytest reports it as a failure) saying which.
No pytest here: the checks are coroutines, each call bounded by ``timeout``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..cloud.provider import (Constraints, CreatedSession, Offer, OfferChoice, Provider, Released, Session,
                              SshDetails, consumer_id)
from ..errors import ApiError, NoEligibleOffer, Stage
from ..settings import Settings

#: A session id no provider has: an id by the rule of ``ids.py``, as one of the sandbox's would be.
UNKNOWN_SESSION = "44444444-4444-4444-8444-444444444444"
#: The methods whose parameters must be the protocol's, names and order (isinstance checks only
#: that they exist: a keyword the protocol gained and one provider lacks would fail only in a cell).
SIGNED = ("create", "choose_offer", "wait_running", "get_session", "owned_sessions", "release")


class ContractBroken(AssertionError):
    """A provider that breaks a rule of the contract; the message says which."""


def holds(condition: Any, rule: str) -> None:
    """Raise :class:`ContractBroken` with ``rule`` unless ``condition``."""
    if not condition:
        raise ContractBroken(rule)


@dataclass
class ProviderUnderTest:
    """A provider and what to ask of it."""

    provider: Provider
    #: What a cell asks that the provider has an offer for now.
    wanted: Constraints
    #: The run id its consumer ids are made for (:func:`~pytest_gpubench.cloud.provider.consumer_id`).
    run_id: str = "contract"
    #: Seconds each call may take.
    timeout: float = 60.0
    #: Log in with the SSH details (over SSH, or this machine's shell for ``SshDetails.local``).
    login: bool = True

    async def call(self, awaitable: Awaitable[Any]) -> Any:
        return await asyncio.wait_for(awaitable, self.timeout)

    def consumer(self, name: str) -> str:
        return consumer_id(self.run_id, name)


async def check_protocol(subject: ProviderUnderTest) -> None:
    """It is a :class:`Provider` that names where it rents, and its methods take the protocol's parameters."""
    provider = subject.provider
    holds(isinstance(provider, Provider), f"{type(provider).__name__} lacks a method of the Provider protocol")
    holds(isinstance(provider.where, str) and provider.where, "`where` names what it rents through")
    for name in SIGNED:
        wanted = list(inspect.signature(getattr(Provider, name)).parameters)[1:]
        found = list(inspect.signature(getattr(provider, name)).parameters)
        holds(found == wanted, f"{name} takes {found}, the protocol's parameters are {wanted}")


async def check_offers(subject: ProviderUnderTest) -> None:
    """Offers are :class:`Offer` s; a cell's choice is one of the eligible ones, found among the offers;
    a price cap nothing meets, and a GPU nobody offers, are ``NoEligibleOffer``."""
    offers = await subject.call(subject.provider.offers())
    holds(offers and all(isinstance(offer, Offer) for offer in offers), "offers() lists Offer objects, at least one")
    choice = await subject.call(subject.provider.choose_offer(subject.wanted))
    holds(isinstance(choice, OfferChoice), "choose_offer answers an OfferChoice")
    holds(choice.offer in choice.eligible, "the chosen offer is one of the eligible ones")
    holds(choice.offers_found >= len(choice.eligible), "offers_found counts at least the eligible offers")
    for impossible, what in ((dataclasses.replace(subject.wanted, max_price=0.0001), "a price cap nothing meets"),
                             (dataclasses.replace(subject.wanted, gpu="No Such GPU 9000"), "a GPU nobody offers")):
        try:
            await subject.call(subject.provider.choose_offer(impossible))
        except NoEligibleOffer:
            continue
        raise ContractBroken(f"choose_offer for {what} raises NoEligibleOffer")


async def rent(subject: ProviderUnderTest, name: str) -> tuple[CreatedSession, Session]:
    """A session created for the subject's choice and waited for until it runs."""
    choice = await subject.call(subject.provider.choose_offer(subject.wanted))
    created = await subject.call(subject.provider.create(choice.offer, subject.consumer(name), 1,
                                                         runtime=subject.wanted.runtime))
    holds(isinstance(created, CreatedSession), "create answers a CreatedSession")
    running = await subject.call(subject.provider.wait_running(created.session.id, timeout=subject.timeout))
    holds(isinstance(running, Session) and running.status == "running",
          f"wait_running answers the session once running, not {getattr(running, 'status', running)!r}")
    return created, running


async def login(subject: ProviderUnderTest, running: Session, ssh: SshDetails) -> str:
    """What ``echo`` prints through a connection made from ``ssh`` alone, as a cell's ``gpu_ssh`` makes it."""
    from .cell_benchmark import GpuSession, connect
    from .run_context import RunContext

    run = RunContext(Settings())  # only its host-key pins are used; nothing is opened
    offer = Offer(id="contract", provider="contract", gpu_type="contract", price_per_hour=0)
    connection = await subject.call(connect(run, GpuSession(running, ssh, None, OfferChoice(offer, 1, [offer])),
                                            subject.timeout))
    try:
        return (await connection.run("echo contract-ok", stage=Stage.SSH_CONNECT, what="a login",
                                     timeout=subject.timeout)).stdout
    finally:
        await connection.close()


async def check_session(subject: ProviderUnderTest) -> None:
    """A session from create to release: running, reachable by its SSH details (the key never in
    a repr), watched, owned under its consumer id, released (and safely released again), priced."""
    provider = subject.provider
    created, running = await rent(subject, "session")
    session_id = created.session.id
    try:
        ssh = provider.ssh_details(created, running)
        holds(isinstance(ssh, SshDetails), "ssh_details answers SshDetails")
        holds(ssh.local or (ssh.host and ssh.port), "the SSH details name a host and port (or local)")
        holds(not ssh.private_key or ssh.private_key not in repr(ssh), "the private key never shows in a repr")
        if subject.login:
            holds("contract-ok" in await login(subject, running, ssh), "the SSH details log in")
        watched = await subject.call(provider.get_session(session_id, Stage.BENCHMARK))
        holds(watched.status == "running", "get_session says a running session runs (the watch's question)")
        owned = await subject.call(provider.owned_sessions(subject.consumer("session")))
        holds([s.id for s in owned] == [session_id], "owned_sessions(consumer) lists the session, only it")
        holds(session_id in {s.id for s in await subject.call(provider.owned_sessions())},
              "owned_sessions() lists every session of the plugin's consumer ids")
    finally:
        released = await subject.call(provider.release(session_id))
    holds(isinstance(released, Released), "release answers Released")
    holds((released.before, released.still_holding) == ("running", False),
          f"release ends a running session (before {released.before!r}, after {released.after!r})")
    holds(session_id not in {s.id for s in await subject.call(provider.owned_sessions())},
          "a released session is no longer owned (nothing holds it)")
    again = await subject.call(provider.release(session_id))
    holds(not again.still_holding and (again.already_ended or not again.found),
          "releasing again is safe: it finds it ended, or no longer knows it")
    cost = await subject.call(provider.session_cost(session_id))
    holds(cost is None or cost >= 0, "session_cost is None or a figure of at least 0")


async def check_unknown_session(subject: ProviderUnderTest) -> None:
    """A session it does not know: release finds nothing, it has no cost, get_session is a 404."""
    provider = subject.provider
    released = await subject.call(provider.release(UNKNOWN_SESSION))
    holds(not released.found and released.final_status == "not_found", "releasing an unknown session finds nothing")
    holds(await subject.call(provider.session_cost(UNKNOWN_SESSION)) is None, "an unknown session has no cost")
    try:
        await subject.call(provider.get_session(UNKNOWN_SESSION, Stage.CLEANUP))
    except ApiError as exc:
        holds(exc.status == 404, f"get_session of an unknown session is an ApiError 404, not {exc.status}")
    else:
        raise ContractBroken("get_session of an unknown session raises an ApiError 404")


#: Every check by name, in the order :func:`check_provider` runs them.
CHECKS: dict[str, Callable[[ProviderUnderTest], Awaitable[None]]] = {
    "protocol": check_protocol,
    "offers": check_offers,
    "session": check_session,
    "unknown_session": check_unknown_session,
}


async def check_provider(subject: ProviderUnderTest) -> None:
    """Every check of :data:`CHECKS` on ``subject``, in order; the first broken rule raises."""
    for check in CHECKS.values():
        await check(subject)
