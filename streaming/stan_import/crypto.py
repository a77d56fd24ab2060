"""Decrypting the payloads of an encrypted nats-streaming-server store.

Only a message's data is encrypted, as `code | nonce (12) | ciphertext and tag (16)`, code 1 being
AES-256-GCM and 2 ChaCha20-Poly1305 (chosen per message by that byte, whatever cipher the server was
set to), with no associated data. Each channel has its own key: SHA-256 over 33 + len(channel) zero
bytes, then SHA-256(master key), ".", and the channel name (the zeros are how the server builds that
input, and without them no message authenticates). Data that starts with any other byte was stored
before encryption was turned on and is plaintext; empty data is never encrypted.
"""

from __future__ import annotations

import hashlib

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

from streaming.stan_import.model import RefusedError

AES, CHACHA = 1, 2
CIPHERS = {"AES": AES, "CHACHA": CHACHA}
NONCE, TAG = 12, 16
# What an encrypted payload at least holds: its code, nonce and tag.
SMALLEST = 1 + NONCE + TAG


class DecryptionError(Exception):
    """A payload did not authenticate: a wrong key (or not encrypted data that looks encrypted)."""


def channel_key(master_key: bytes, channel: str) -> bytes:
    name = channel.encode()
    zeros = bytes(32 + 1 + len(name))
    return hashlib.sha256(zeros + hashlib.sha256(master_key).digest() + b"." + name).digest()


class LooksEncrypted:
    """Counts a channel's payloads that look encrypted when no key was given: if all of them do, the
    store was written with --encrypt, and importing them would store ciphertext as the messages."""

    def __init__(self, channel: str) -> None:
        self.channel, self.payloads, self.clear = channel, 0, False

    def see(self, data: bytes) -> bool:
        """Count a payload; False for one that does not look encrypted (after it, none need be seen)."""
        self.payloads += 1
        if data[0] in (AES, CHACHA) and len(data) >= SMALLEST:
            return True
        self.clear = True
        return False

    def check(self) -> None:
        if not self.clear and self.payloads >= 2:
            raise RefusedError(
                f"channel {self.channel!r}: every payload looks encrypted: the store was written with "
                "--encrypt; give its key with --encryption_key (or NATS_STREAMING_ENCRYPTION_KEY)"
            )


class ChannelDecryptor:
    """Decrypts the data of one channel's messages."""

    def __init__(self, master_key: bytes, channel: str) -> None:
        key = channel_key(master_key, channel)
        self._ciphers: dict[int, AESGCM | ChaCha20Poly1305] = {AES: AESGCM(key), CHACHA: ChaCha20Poly1305(key)}

    def decrypt(self, data: bytes) -> bytes:
        """The plaintext of a stored payload (returned as it is when not encrypted)."""
        if not data or data[0] not in self._ciphers:
            return data
        if len(data) < SMALLEST:
            raise DecryptionError(f"an encrypted payload of {len(data)} bytes is shorter than its nonce and tag")
        try:
            return self._ciphers[data[0]].decrypt(data[1 : 1 + NONCE], data[1 + NONCE :], None)
        except InvalidTag:
            name = "AES-256-GCM" if data[0] == AES else "ChaCha20-Poly1305"
            raise DecryptionError(f"a payload encrypted with {name} does not authenticate with this key") from None
