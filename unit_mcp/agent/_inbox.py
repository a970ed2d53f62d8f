"""Inbox: the messages a session receives while it may be busy.

Queued messages start the next turn; steering messages are meant for the turn that is running and are
delivered before its next model request. Sequence numbers record arrival order across both queues, so a
message that was steered but arrived too late for its turn can be re-queued without losing its place.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from typing import Literal

from pydantic import BaseModel, Field

InboxKind = Literal["queued", "steering"]
_sequence = itertools.count(1)


class InboxMessage(BaseModel):
    text: str
    kind: InboxKind
    seq: int = Field(default_factory=lambda: next(_sequence))
    arrived_at: float = Field(default_factory=time.time)


class Inbox:
    def __init__(self) -> None:
        self._queued: deque[InboxMessage] = deque()
        self._steering: deque[InboxMessage] = deque()

    def enqueue(self, text: str) -> InboxMessage:
        message = InboxMessage(text=text, kind="queued")
        self._queued.append(message)
        return message

    def steer(self, text: str) -> InboxMessage:
        message = InboxMessage(text=text, kind="steering")
        self._steering.append(message)
        return message

    @property
    def has_queued(self) -> bool:
        return bool(self._queued)

    @property
    def has_steering(self) -> bool:
        return bool(self._steering)

    def drain_queued(self) -> list[InboxMessage]:
        drained = list(self._queued)
        self._queued.clear()
        return drained

    def drain_steering(self) -> list[InboxMessage]:
        drained = list(self._steering)
        self._steering.clear()
        return drained

    def restore_steering(self, messages: list[InboxMessage]) -> None:
        """Put back drained steering that could not be delivered (its turn was cancelled mid-delivery)."""
        self._steering.extendleft(reversed(messages))

    def requeue_steering(self) -> int:
        """At the end of a turn: steering that arrived too late becomes queued input for the next turn."""
        late = self.drain_steering()
        for message in late:
            self._queued.append(message.model_copy(update={"kind": "queued"}))
        ordered = sorted(self._queued, key=lambda m: m.seq)
        self._queued = deque(ordered)
        return len(late)
