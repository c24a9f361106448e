"""The replicated key-value state machine: commands, validation, and their application into LMDB."""
from statemachine.commands import (
    CommandLimits,
    decode_command,
    delete_op,
    encode_command,
    put_op,
    validate_header,
    validate_key,
    validate_ops,
    validate_value,
)
from statemachine.errors import ApplyOrderError, InvalidCommandError, StateFullError
from statemachine.client_sessions import SessionStats
from statemachine.apply_batch import ApplyOutcome
from statemachine.kv_state import KVStateMachine

__all__ = [
    "ApplyOrderError", "ApplyOutcome", "CommandLimits", "InvalidCommandError", "KVStateMachine", "SessionStats", "StateFullError",
    "decode_command", "delete_op", "encode_command", "put_op", "validate_header", "validate_key",
    "validate_ops", "validate_value",
]
