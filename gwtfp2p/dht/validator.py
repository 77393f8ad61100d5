"""The DHT record validator every gwtf node runs: only sealed values bound to their key are stored or read.

hivemind calls ``validate`` when a peer asks this node to store a record and on every record a peer
returns to a lookup (``hivemind/dht/protocol.py``: ``rpc_store``, ``call_find``); an invalid record
is refused or ignored there. hivemind hands over the key as its DHT id (a hash), the subkey and the
value msgpack-serialized: the sealed value must name the key that hashes to that id, the same
subkey and the same expiration, carry a valid signature (``sealed.unseal``) and obey gwtf's
ownership rules (``sealed.check_entry``). Anything else, garbage included, is refused.
"""

from __future__ import annotations

import logging
import time

from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils.serializer import MSGPackSerializer

from gwtfp2p.dht.records import RecordError
from gwtfp2p.dht.sealed import check_entry, unseal

logger = logging.getLogger(__name__)
REGULAR_VALUE = MSGPackSerializer.dumps(None)  # hivemind's subkey bytes of a value without a subkey
LOG_EVERY_S = 5.0  # refused records are logged at most this often (with the count since the last line)


class SealedValueValidator(RecordValidatorBase):
    """Accepts a record only if its value is a sealed gwtf value for exactly this key, subkey and expiration.

    ``verify_signatures=False`` (a swarm run with signatures off, for measuring their cost) still
    requires the seal's binding and ownership rules, with the signer taken from the subkey.
    """

    def __init__(self, verify_signatures: bool = True) -> None:
        self.verify_signatures = verify_signatures
        self.refused = 0
        self._logged_at = -LOG_EVERY_S
        self._unlogged = 0

    def _refuse(self, why: str) -> bool:
        """Count a refused record; log it (a warning, at most every ``LOG_EVERY_S``) for whoever watches."""
        self.refused += 1
        self._unlogged += 1
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_S:
            logger.warning("refusing a DHT record (%d since the last line): %s", self._unlogged, why)
            self._logged_at, self._unlogged = now, 0
        return False

    def validate(self, record: DHTRecord) -> bool:
        try:
            value = MSGPackSerializer.loads(record.value)
            sealed = unseal(value, verify_signature=self.verify_signatures)
            if DHTID.generate(source=sealed.key).to_bytes() != record.key:
                raise RecordError(f"sealed for {sealed.key!r}, stored under another key")
            subkey = MSGPackSerializer.dumps(sealed.subkey) if sealed.subkey else REGULAR_VALUE
            if subkey != record.subkey:
                raise RecordError(f"sealed for subkey {sealed.subkey!r}, stored under another one")
            if sealed.expiration != record.expiration_time:
                raise RecordError("sealed with another expiration time")
            check_entry(sealed)
        except (RecordError, ValueError, TypeError) as e:  # msgpack raises several types on garbage
            return self._refuse(str(e))
        except Exception as e:  # a peer's bytes must never break hivemind's handler
            return self._refuse(f"its value broke the parser: {e!r}")
        return True

    @property
    def priority(self) -> int:
        return 10

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return False
