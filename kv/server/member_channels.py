"""Channels from this member to the other members' client ports (the etcd face's forwarding to the
leader, the state check's and alarm watch's Status calls): one per address, plaintext or TLS as
the client ports speak it, with this member's client certificate as it is now.

When the certificate files change (kv/server/tls.py, ClientPortTLS), the next call to an address
gets a channel made with the new files; the old channel is closed after a grace, so that the
calls still on it end as they would have."""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import grpc

# How long a channel made with replaced files still carries the calls already on it.
RETIRE_GRACE_S = 30.0


class MemberChannels:
    """`credentials()`: the channel credentials now (None: plaintext); `options`: each channel's."""

    def __init__(self, credentials: Callable[[], grpc.ChannelCredentials | None],
                 options: Sequence[tuple[str, int]] = ()) -> None:
        self._credentials = credentials
        self._options = list(options)
        self._channels: dict[str, tuple[grpc.ChannelCredentials | None, grpc.aio.Channel]] = {}
        self._retiring: set[asyncio.Task[None]] = set()

    def get(self, address: str) -> grpc.aio.Channel:
        credentials = self._credentials()
        held = self._channels.get(address)
        if held is not None and held[0] is credentials:
            return held[1]
        channel = (grpc.aio.insecure_channel(address, options=self._options) if credentials is None
                   else grpc.aio.secure_channel(address, credentials, options=self._options))
        self._channels[address] = (credentials, channel)
        if held is not None:
            task = asyncio.get_running_loop().create_task(held[1].close(grace=RETIRE_GRACE_S))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)
        return channel

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for task in self._retiring:
            task.cancel()
        await asyncio.gather(*(channel.close() for _, channel in channels.values()), *self._retiring,
                             return_exceptions=True)
