"""HPACK's Huffman decoding (``codec.hpack_huffman``): the RFC's examples, every byte, and what is not a string."""

from __future__ import annotations

import random

import pytest
from hpack.huffman import HuffmanEncoder
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH

from tether.proxy.codec.hpack_huffman import CODES, HuffmanError, decode_huffman


def test_the_rfc_examples_decode() -> None:
    # RFC 7541 C.4.1-C.4.3 and C.6.1.
    assert decode_huffman(bytes.fromhex("f1e3c2e5f23a6ba0ab90f4ff")) == b"www.example.com"
    assert decode_huffman(bytes.fromhex("a8eb10649cbf")) == b"no-cache"
    assert decode_huffman(bytes.fromhex("25a849e95ba97d7f")) == b"custom-key"
    assert decode_huffman(bytes.fromhex("d07abe941054d444a8200595040b8166e082a62d1bff")) == \
        b"Mon, 21 Oct 2013 20:13:21 GMT"
    assert decode_huffman(b"") == b""


def test_every_byte_round_trips_through_an_independent_encoder() -> None:
    """The table is the RFC's (as the hpack package has it), and every symbol decodes from any position."""
    assert CODES == tuple(zip(REQUEST_CODES, REQUEST_CODES_LENGTH))
    encoder = HuffmanEncoder(REQUEST_CODES, REQUEST_CODES_LENGTH)
    assert decode_huffman(encoder.encode(bytes(range(256)))) == bytes(range(256))
    rng = random.Random(13)
    for _ in range(500):
        text = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
        assert decode_huffman(encoder.encode(text)) == text


@pytest.mark.parametrize("data", [
    bytes.fromhex("ffffffff"),  # EOS (thirty ones) inside the string
    bytes.fromhex("f1e3c2e5f23a6ba0ab90f4ff") + b"\xff",  # then eight more ones: padding too long
    b"\x00",  # "0" (00000), then 000: padding that is not ones
    b"\xfe",  # 1111111 0: the start of a longer code, not padding
])
def test_what_is_not_a_huffman_string_is_refused(data: bytes) -> None:
    with pytest.raises(HuffmanError):
        decode_huffman(data)


def test_up_to_seven_ones_of_padding_end_a_string() -> None:
    assert decode_huffman(b"\x07") == b"0"  # 00000 111
    assert decode_huffman(b"\x00\x3f") == b"00"  # 00000 00000 111111
