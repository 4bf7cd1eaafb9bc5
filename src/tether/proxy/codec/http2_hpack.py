"""HPACK (RFC 7541) for the proxy's HTTP/2 codec: a full decoder, and an encoder that never indexes (sans-IO).

Decoding is all of RFC 7541: the static and dynamic tables, size updates
(only at the start of a block, never above what we advertised), integers
and strings with Huffman coding. Huffman strings are decoded by
``codec.hpack_huffman`` (a state table over the RFC's code, four bits a
step) behind a cache: a peer's Huffman-coded strings repeat
(a client's ``user-agent``, a server's ``date`` within its second), and most
fields of a steady stream of requests are table indexes, which cost one
list lookup each. A block that reads nothing from the dynamic table decodes
the same way whatever the table holds: ``decode_block`` says so, with the
fields it added, and the caller that sees the same bytes again may
``replay`` those instead of decoding (nginx's responses: every one indexes
its ``server`` and ``date``). The size of the decoded list is bounded
(``max_header_list_size``, counted as RFC 9113 §6.5.2 counts it).

Encoding uses no dynamic table: a field is a static-table index when the
whole field is there, else a literal without indexing (the name indexed
when it is in the static table), never Huffman-coded. Every field's bytes
are then a pure function of the field, so they are cached: forwarding the
same headers again is one join of cached bytes. The first block says the
table is empty (a size update to 0), so no peer setting can make the
encoding wrong. A few bytes more per block than an indexing encoder; no
table state to keep and nothing per character.

Errors: ``HpackError`` (the connection error COMPRESSION_ERROR, RFC 9113
§4.3) and ``HeaderListTooLarge`` (the peer ignored our
SETTINGS_MAX_HEADER_LIST_SIZE: ENHANCE_YOUR_CALM, as h2 answers it).

Callers: ``codec.http2`` (``H2Endpoint``), and tests.
"""

from __future__ import annotations

from itertools import chain

from tether.proxy.codec.hpack_huffman import HuffmanError, decode_huffman

Header = tuple[bytes, bytes]

# RFC 7541 Appendix A. Index 1 is STATIC[0].
STATIC: tuple[Header, ...] = tuple((n.encode(), v.encode()) for n, v in (
    (":authority", ""), (":method", "GET"), (":method", "POST"), (":path", "/"), (":path", "/index.html"),
    (":scheme", "http"), (":scheme", "https"), (":status", "200"), (":status", "204"), (":status", "206"),
    (":status", "304"), (":status", "400"), (":status", "404"), (":status", "500"), ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"), ("accept-language", ""), ("accept-ranges", ""), ("accept", ""),
    ("access-control-allow-origin", ""), ("age", ""), ("allow", ""), ("authorization", ""),
    ("cache-control", ""), ("content-disposition", ""), ("content-encoding", ""), ("content-language", ""),
    ("content-length", ""), ("content-location", ""), ("content-range", ""), ("content-type", ""),
    ("cookie", ""), ("date", ""), ("etag", ""), ("expect", ""), ("expires", ""), ("from", ""), ("host", ""),
    ("if-match", ""), ("if-modified-since", ""), ("if-none-match", ""), ("if-range", ""),
    ("if-unmodified-since", ""), ("last-modified", ""), ("link", ""), ("location", ""), ("max-forwards", ""),
    ("proxy-authenticate", ""), ("proxy-authorization", ""), ("range", ""), ("referer", ""), ("refresh", ""),
    ("retry-after", ""), ("server", ""), ("set-cookie", ""), ("strict-transport-security", ""),
    ("transfer-encoding", ""), ("user-agent", ""), ("vary", ""), ("via", ""), ("www-authenticate", ""),
))
STATIC_COUNT = len(STATIC)  # 61
ENTRY_OVERHEAD = 32  # RFC 7541 §4.1: an entry's size is its name, its value and 32
DEFAULT_TABLE_SIZE = 4096

_FIELD_INDEX = {field: i + 1 for i, field in enumerate(STATIC)}
_NAME_INDEX: dict[bytes, int] = {}
for _i, (_name, _) in enumerate(STATIC):
    _NAME_INDEX.setdefault(_name, _i + 1)

_HUFFMAN_CACHE_SIZE = 1024  # distinct Huffman strings remembered (then forgotten all at once)
_ENCODE_CACHE_SIZE = 4096  # distinct fields remembered by an encoder


class HpackError(Exception):
    """A header block that cannot be decoded: the connection error COMPRESSION_ERROR."""


class HeaderListTooLarge(Exception):
    """A header list over our SETTINGS_MAX_HEADER_LIST_SIZE."""


def encode_integer(value: int, prefix_bits: int, first: int) -> bytes:
    """``value`` with an N-bit prefix (RFC 7541 §5.1); ``first``: the flag bits of the first byte."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(value: bytes) -> bytes:
    return encode_integer(len(value), 7, 0) + value


def encode_field(name: bytes, value: bytes) -> bytes:
    """One field as this encoder writes it: a static index, else a literal without indexing."""
    index = _FIELD_INDEX.get((name, value))
    if index is not None:
        return encode_integer(index, 7, 0x80)
    index = _NAME_INDEX.get(name, 0)
    if index:
        return encode_integer(index, 4, 0x00) + _literal(value)
    return b"\x00" + _literal(name) + _literal(value)


class Encoder:
    """Header lists to header blocks, without a dynamic table (see the module docstring)."""

    __slots__ = ("_cache", "_empty_said")

    def __init__(self) -> None:
        self._cache: dict[Header, bytes] = {}
        self._empty_said = False

    def table_size_changed(self) -> None:
        """The peer changed SETTINGS_HEADER_TABLE_SIZE: the next block says again that the table is empty."""
        self._empty_said = False

    def encode(self, headers: list[Header] | tuple[Header, ...]) -> bytes:
        cache = self._cache
        try:  # every field seen before (nearly always): joined without a step per field in Python
            block = b"".join(map(cache.__getitem__, headers))
        except KeyError:
            if len(cache) + len(headers) > _ENCODE_CACHE_SIZE:
                cache.clear()
            for field in headers:
                if field not in cache:
                    cache[field] = encode_field(field[0], field[1])
            block = b"".join(map(cache.__getitem__, headers))
        if self._empty_said:
            return block
        self._empty_said = True
        return b"\x20" + block  # first, a dynamic table size update: 0


class Decoder:
    """Header blocks to header lists, with the dynamic table of RFC 7541 §2.3."""

    __slots__ = ("table", "size", "max_size", "settings_max", "max_header_list_size", "generation", "_huffman",
                 "_read_table")

    def __init__(self, max_header_list_size: int = 65536) -> None:
        self.table: list[Header] = []  # newest first: dynamic index 62 is table[0]
        self.size = 0
        self.max_size = DEFAULT_TABLE_SIZE  # as the peer last set it
        self.settings_max = DEFAULT_TABLE_SIZE  # our SETTINGS_HEADER_TABLE_SIZE: the ceiling of max_size
        self.max_header_list_size = max_header_list_size
        # Counts the changes to the table: a block that made none decodes the same way while this stays the same.
        self.generation = 0
        self._huffman: dict[bytes, bytes] = {}
        self._read_table = False  # the block being decoded read the dynamic table (see decode_block)

    def _evict(self, room: int) -> None:
        table = self.table
        while table and self.size > room:
            name, value = table.pop()
            self.size -= len(name) + len(value) + ENTRY_OVERHEAD

    def _add(self, field: Header) -> None:
        self.generation += 1
        entry = len(field[0]) + len(field[1]) + ENTRY_OVERHEAD
        if entry > self.max_size:
            self.table.clear()  # RFC 7541 §4.4: an entry larger than the table empties it
            self.size = 0
            return
        if self.size > self.max_size - entry:  # (no call while there is room)
            self._evict(self.max_size - entry)
        self.table.insert(0, field)
        self.size += entry

    def _field(self, index: int) -> Header:
        if 0 < index <= STATIC_COUNT:
            return STATIC[index - 1]
        self._read_table = True
        try:
            if index <= 0:
                raise IndexError
            return self.table[index - STATIC_COUNT - 1]
        except IndexError:
            raise HpackError(f"HPACK index {index} is not in the table") from None

    def _string(self, data: bytes, pos: int) -> tuple[bytes, int]:
        if pos >= len(data):
            raise HpackError("HPACK string cut short")
        byte = data[pos]
        if byte & 0x7F != 0x7F:  # the length fits its 7-bit prefix
            length = byte & 0x7F
            pos += 1
        else:
            length, pos = _integer(data, pos, 7)
        end = pos + length
        if end > len(data):
            raise HpackError("HPACK string longer than its block")
        raw = data[pos:end]
        if not byte & 0x80:
            return raw, end
        decoded = self._huffman.get(raw)
        if decoded is None:
            try:
                decoded = decode_huffman(raw)
            except HuffmanError as exc:
                raise HpackError(f"bad Huffman string: {exc}") from None
            if len(self._huffman) >= _HUFFMAN_CACHE_SIZE:
                self._huffman.clear()
            self._huffman[raw] = decoded
        return decoded, end

    def _literal(self, data: bytes, pos: int, prefix_bits: int) -> tuple[Header, int]:
        """A literal field: its name by index (non-zero) or as a string, then its value."""
        mask = (1 << prefix_bits) - 1
        index = data[pos] & mask
        if index < mask:  # the index fits its prefix (every static name): no _integer call
            pos += 1
        else:
            index, pos = _integer(data, pos, prefix_bits)
        if index:
            name = STATIC[index - 1][0] if index <= STATIC_COUNT else self._field(index)[0]
        else:
            name, pos = self._string(data, pos)
        value, pos = self._string(data, pos)
        return (name, value), pos

    def decode(self, data: bytes) -> list[Header]:
        """One complete header block (HEADERS + CONTINUATIONs joined)."""
        return self.decode_block(data)[0]

    def decode_block(self, data: bytes) -> tuple[list[Header], tuple[Header, ...] | None]:
        """One complete header block, and what decoding it again would do whatever the table then holds: when
        the block read no dynamic-table entry and updated no table size, the fields it added to the table (in
        order, maybe none), for ``replay``; else None (decoding it again may give other fields).

        A server that indexes its response fields but never refers to them (nginx adds ``server``, ``date``,
        ``content-type``... to the table with every response) sends such blocks: the caller may remember one
        decoded and, when the same bytes come again, ``replay`` its additions instead of decoding it.
        """
        headers: list[Header] = []
        append = headers.append
        pos = 0
        end = len(data)
        listed = 0
        limit = self.max_header_list_size
        first = True
        added: list[Header] = []
        portable = True
        self._read_table = False
        while pos < end:
            byte = data[pos]
            if byte & 0x80:  # indexed field
                if byte != 0xFF:  # the index fits its 7-bit prefix (all but the largest dynamic indexes)
                    index = byte & 0x7F
                    pos += 1
                else:
                    index, pos = _integer(data, pos, 7)
                field = STATIC[index - 1] if 0 < index <= STATIC_COUNT else self._field(index)
            elif byte & 0x40:  # literal with incremental indexing
                field, pos = self._literal(data, pos, 6)
                self._add(field)
                added.append(field)
            elif byte & 0x20:  # dynamic table size update
                if not first:
                    raise HpackError("HPACK table size update after a field")
                size, pos = _integer(data, pos, 5)
                if size > self.settings_max:
                    raise HpackError(f"HPACK table size {size} above the {self.settings_max} advertised")
                self.max_size = size
                self.generation += 1
                self._evict(size)
                portable = False
                continue
            else:  # literal without indexing (0000) or never indexed (0001)
                field, pos = self._literal(data, pos, 4)
            first = False
            listed += len(field[0]) + len(field[1]) + ENTRY_OVERHEAD
            if listed > limit:
                raise HeaderListTooLarge(f"header list over {limit} bytes")
            append(field)
        return headers, tuple(added) if portable and not self._read_table else None

    def replay(self, added: tuple[Header, ...]) -> None:
        """The table as decoding again the block ``decode_block`` returned ``added`` for leaves it: the fields
        added newest first, then the oldest evicted down to the table's size. (Adding one at a time, each after
        evicting what it needs, keeps the same newest entries: those that fit the table.)"""
        self.generation += 1
        self.table[:0] = added[::-1]
        self.size += sum(map(len, chain.from_iterable(added))) + ENTRY_OVERHEAD * len(added)
        if self.size > self.max_size:
            self._evict(self.max_size)


def _integer(data: bytes, pos: int, prefix_bits: int) -> tuple[int, int]:
    """The integer at ``data[pos]`` with an N-bit prefix, and the position after it."""
    limit = (1 << prefix_bits) - 1
    value = data[pos] & limit
    pos += 1
    if value < limit:
        return value, pos
    shift = 0
    end = len(data)
    while True:
        if pos >= end:
            raise HpackError("HPACK integer cut short")
        byte = data[pos]
        pos += 1
        value += (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 28:  # nothing in a header block needs more than 2^28
            raise HpackError("HPACK integer too large")
