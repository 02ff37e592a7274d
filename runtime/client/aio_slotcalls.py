"""The asyncio side of client/slotcalls.py: a call that takes a slot or holds claims, awaited,
and given back when its task is cancelled.

Owns only the awaiting and the shielded give back; what each call sends, and what undoes it,
lives in client/slotcalls.py, once, for both clients. It must never build a request itself, nor
import the node or the actors.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from subagents_node.client.slotcalls import A, OnceCall

if TYPE_CHECKING:
    from subagents_node.client.aio import AsyncClient


async def performed_async(client: AsyncClient, call: OnceCall[A]) -> A:
    """The asyncio client's call: its answer; cancelled (`wait_for` ran out, the task was
    cancelled), what it took is given back first, shielded: cancelled again, the give back
    goes on by itself."""
    try:
        return await client.perform(call.plan())
    except asyncio.CancelledError:
        await asyncio.shield(client.perform(call.give_back_plan()))
        raise
