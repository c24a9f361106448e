"""Errors of the state machine: a command that cannot be accepted, and a state that cannot grow."""
from __future__ import annotations


class InvalidCommandError(ValueError):
    """A command (or one of its keys, values or ops) is not acceptable. The message says what is
    wrong and what the limit is, so the client service can pass it on as INVALID_ARGUMENT."""


class StateFullError(RuntimeError):
    """The state machine's LMDB map, or the disk under it, is full: the batch was not applied
    (nothing of it was written) and the applied index did not move. Reads keep working; a full map
    needs a larger map_size, a full disk freed space."""


class ApplyOrderError(ValueError):
    """`apply` was given entries that do not continue the applied index: a driver bug. Nothing of
    the batch was applied."""


class CorruptStateError(RuntimeError):
    """What the state holds on disk is damaged (a value fails its checksum): never serve it. The
    member stops serving; its data is replaced from its peers (README, "Recovering a member")."""
