"""What one gateway replica tells its peers: the two notes of the replica-sync contract.

A replica that routes a request sends a ``RoutedNote``: the request's ``RoutingKey`` and the
``Decision`` it took (the very objects its strategy's ``on_routed`` saw), plus the in-flight
tokens the request adds. When the request ends it sends a ``FinishedNote`` naming the routed
note it ends and the tokens it releases. A peer applies them as its own routings and
completions (``routing.replicas.ReplicaView``): the strategy learns the prefix, the fan-out, the
prompt's end and the predicted work through the same ``on_routed``, and the in-flight counts per
instance go up and down, so every replica balances the fleet's load, not only its own.

A note is identified by ``(origin, variant, seq)``: ``seq`` numbers the routed requests of one
origin replica and one variant from 1, one by one (a ``FinishedNote`` carries its routed note's
``seq``). The key and decision are kept whole, not copied field by field, so a field added to
``RoutingKey`` or ``Decision`` reaches the peers' strategies without a second list to update
(the wire codec, ``api.replica_sync``, is tested to cover every field).
"""

from __future__ import annotations

from dataclasses import dataclass

from warmfleet.core.types import Decision, InstanceId, RoutingKey


@dataclass(frozen=True, slots=True, init=False)  # __init__: see core.types
class RoutedNote:
    """``origin`` routed request ``seq`` of ``variant`` (key ``key``) by ``decision``; it adds
    ``tokens`` in-flight tokens to ``decision.instance_id`` until its ``FinishedNote``."""

    origin: str
    variant: str
    seq: int
    key: RoutingKey
    decision: Decision
    tokens: int

    def __init__(  # noqa: PLR0917 (the fields in order, as a dataclass takes them)
        self, origin: str, variant: str, seq: int, key: RoutingKey, decision: Decision, tokens: int
    ) -> None:
        object.__setattr__(self, "origin", origin)
        object.__setattr__(self, "variant", variant)
        object.__setattr__(self, "seq", seq)
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "decision", decision)
        object.__setattr__(self, "tokens", tokens)

    @property
    def instance_id(self) -> InstanceId:
        return self.decision.instance_id


@dataclass(frozen=True, slots=True, init=False)
class FinishedNote:
    """Request ``seq`` that ``origin`` routed to ``instance_id`` ended (done, failed or
    cancelled): its ``tokens`` in-flight tokens are released."""

    origin: str
    variant: str
    seq: int
    instance_id: InstanceId
    tokens: int

    def __init__(
        self, origin: str, variant: str, seq: int, instance_id: InstanceId, tokens: int
    ) -> None:
        object.__setattr__(self, "origin", origin)
        object.__setattr__(self, "variant", variant)
        object.__setattr__(self, "seq", seq)
        object.__setattr__(self, "instance_id", instance_id)
        object.__setattr__(self, "tokens", tokens)


SyncNote = RoutedNote | FinishedNote


def in_flight_tokens(key: RoutingKey) -> int:
    """The in-flight tokens a routed request counts for (prompt + expected output), as the
    simulator and the gateway count them."""
    return key.prompt_tokens + key.output_tokens_hint


def routed_note(
    origin: str, variant: str, seq: int, key: RoutingKey, decision: Decision
) -> RoutedNote:
    """The note of a local routing (``tokens``: ``in_flight_tokens(key)``)."""
    return RoutedNote(origin, variant, seq, key, decision, in_flight_tokens(key))


def finished_note(note: RoutedNote) -> FinishedNote:
    """The note that ends ``note``'s request."""
    return FinishedNote(note.origin, note.variant, note.seq, note.instance_id, note.tokens)
