"""``keel-manage dlq``: what was dead-lettered, and why.

Casts that keel gave up on (a handler that kept failing, a message it could not parse, a
consumer that kept dying) wait on ``<exchange>.dead-letter.casts`` until an operator
looks: each is work that was not done. ``--calls`` shows the calls kept on
``<exchange>.dead-letter.calls`` instead: those expired or were rejected, and their
callers were already told. Listing does not remove anything; ``purge`` does.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from pydantic import ValidationError

from services.manage.commands import set_handler
from services.manage.commands.service import table
from shared.config import Settings
from shared.exceptions import KeelError
from shared.rpc.amqp import AmqpTransport
from shared.rpc.envelope import Envelope
from shared.rpc.transport import DeadLetter

COLUMNS = ("#", "Kind", "Topic", "Method", "Version", "Instance", "Reason", "Deliveries")
#: How much of a reason a list line shows; ``dlq show`` shows all of it.
REASON_WIDTH = 60


@asynccontextmanager
async def _transport(settings: Settings) -> AsyncIterator[AmqpTransport]:
    transport = AmqpTransport.from_settings(settings)
    await transport.connect()
    try:
        yield transport
    finally:
        await transport.close()


def _envelope(dead: DeadLetter) -> Envelope | None:
    try:
        return Envelope.model_validate_json(dead.body)
    except ValidationError:
        return None


def _instance(envelope: Envelope | None) -> str:
    """The instance a dead message was about, if it names one."""
    if envelope is None:
        return ""
    args = envelope.args
    found = args.get("instance_uuid")
    for holder, key in (("instance", "uuid"), ("spec", "instance_uuid")):
        nested = args.get(holder)
        if not found and isinstance(nested, dict):
            found = nested.get(key)
    return str(found) if found else ""


def _reason(dead: DeadLetter) -> str:
    return f"{dead.reason}: {dead.detail}" if dead.detail else dead.reason


def rows(found: Sequence[DeadLetter]) -> list[tuple[str, ...]]:
    body: list[tuple[str, ...]] = []
    for number, dead in enumerate(found, start=1):
        envelope = _envelope(dead)
        reason = _reason(dead).replace("\n", " ")
        if len(reason) > REASON_WIDTH:
            reason = reason[: REASON_WIDTH - 1] + "…"
        body.append(
            (
                str(number),
                dead.kind,
                dead.topic,
                envelope.method if envelope else "(unreadable)",
                envelope.version if envelope else "",
                _instance(envelope),
                reason,
                str(dead.delivery_count),
            )
        )
    return body


async def list_(args: argparse.Namespace, settings: Settings) -> int:
    async with _transport(settings) as transport:
        found = await transport.dead_letters(args.limit, calls=args.calls)
    what = "calls" if args.calls else "casts"
    if not found:
        print(f"no dead-lettered {what} on exchange {settings.exchange}")
        return 0
    print(table(COLUMNS, rows(found)))
    return 0


async def show(args: argparse.Namespace, settings: Settings) -> int:
    async with _transport(settings) as transport:
        found = await transport.dead_letters(args.number, calls=args.calls)
    if len(found) < args.number:
        raise KeelError(
            f"there are {len(found)} dead-lettered {'calls' if args.calls else 'casts'}; "
            f"no number {args.number} (see `keel-manage dlq list`)"
        )
    dead = found[args.number - 1]
    envelope = _envelope(dead)
    print(f"kind:        {dead.kind}")
    print(f"topic:       {dead.topic}")
    print(f"message id:  {dead.message_id or ''}")
    print(f"reason:      {dead.reason}")
    print(f"detail:      {dead.detail}")
    print(f"deliveries:  {dead.delivery_count}")
    print(f"instance:    {_instance(envelope)}")
    if envelope is None:
        print(f"body (not a keel envelope): {dead.body[:2000]!r}")
    else:
        print("envelope:")
        print(json.dumps(envelope.model_dump(mode="json"), indent=2))
    return 0


async def purge(args: argparse.Namespace, settings: Settings) -> int:
    async with _transport(settings) as transport:
        removed = await transport.purge_dead_letters(calls=args.calls)
    print(f"removed {removed} dead-lettered {'calls' if args.calls else 'casts'}")
    return 0


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"not a whole number >= 1: {value!r}")
    return number


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dlq = commands.add_parser("dlq", help="inspect and purge dead-lettered messages")
    actions = dlq.add_subparsers(dest="action", required=True, metavar="ACTION")
    calls_help = "dead calls instead of dead casts"

    listing = actions.add_parser(
        "list",
        help="list dead-lettered messages, oldest first",
        description="Method, version, instance and reason of each dead-lettered message.",
    )
    listing.add_argument("--calls", action="store_true", help=calls_help)
    listing.add_argument("--limit", type=_positive, default=100, help="at most this many")
    set_handler(listing, list_)

    showing = actions.add_parser("show", help="one dead-lettered message in full")
    showing.add_argument("number", type=_positive, help="its number in `dlq list`")
    showing.add_argument("--calls", action="store_true", help=calls_help)
    set_handler(showing, show)

    purging = actions.add_parser("purge", help="remove every dead-lettered message")
    purging.add_argument("--calls", action="store_true", help=calls_help)
    set_handler(purging, purge)
