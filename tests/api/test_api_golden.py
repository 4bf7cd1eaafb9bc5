"""Golden wire bytes: each case must encode to exactly these bytes and decode back.

The bytes are hand-derived from the protobuf encoding rules (tag = number << 3 |
wire type; varints 7 bits at a time, low group first; fixed32/fixed64 little-endian)
and from the worked examples in proxy-api.md section 2 and proxy.md section 6.1.
"""

from __future__ import annotations

import struct

import pytest
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from tether.api import destination_pb2, http_types_pb2, identity_pb2, net_pb2, transport_pb2

D = destination_pb2
IPV4 = net_pb2.IPAddress(ipv4=0x0A010203)  # 10.1.2.3
IPV6 = net_pb2.IPAddress(ipv6=net_pb2.IPv6(first=0xFD00_0000_0000_0000, last=1))  # fd00::1
TCP_V4 = net_pb2.TcpAddress(ip=IPV4, port=8080)

IDENTITY = "web.shop.serviceaccount.identity.linkerd.cluster.local"  # 54 bytes
TOKEN = bytes(range(200))  # long enough that its length takes a two-byte varint
CSR = b"\x30\x82\x01\x0a"

CASES = [
    # TcpAddress{ip: 10.1.2.3, port: 8080}: 0a 05 = ip, 5 bytes, holding 0d = ipv4
    # (fixed32) 03 02 01 0a; then 10 = port, varint 8080 = 90 3f.
    ("tcp-v4", TCP_V4, "0a 05 0d 03 02 01 0a 10 90 3f"),
    # IPAddress{ipv6: fd00::1}: 12 12 = ipv6, 18 bytes; 09 = first (fixed64), 11 = last.
    ("ip-v6", IPV6, "12 12 09 00000000000000fd 11 0100000000000000"),
    # TcpAddress{[fd00::1]:443}: the 20 bytes above inside 0a 14, then port 443 = bb 03.
    (
        "tcp-v6",
        net_pb2.TcpAddress(ip=IPV6, port=443),
        "0a 14 1212 09 00000000000000fd 11 0100000000000000 10 bb03",
    ),
    # 0.0.0.0 is zero but inside a oneof, so it is still sent.
    ("ip-zero", net_pb2.IPAddress(ipv4=0), "0d 00000000"),
    # Likewise GET = 0 inside HttpMethod's oneof.
    ("method-get", http_types_pb2.HttpMethod(registered=http_types_pb2.HttpMethod.GET), "08 00"),
    # An empty NoEndpoints is still present: 1a 00.
    ("no-endpoints-false", D.Update(no_endpoints=D.NoEndpoints(exists=False)), "1a 00"),
    ("no-endpoints-true", D.Update(no_endpoints=D.NoEndpoints(exists=True)), "1a 02 08 01"),
    # add{addrs: [{addr: 10.1.2.3:8080, weight: 10000}]}: weight 10000 = 18 90 4e.
    (
        "update-add",
        D.Update(add=D.WeightedAddrSet(addrs=[D.WeightedAddr(addr=TCP_V4, weight=10000)])),
        "0a 11 0a 0f 0a 0a 0a050d0302010a10903f 18 904e",
    ),
    ("update-remove", D.Update(remove=D.AddrSet(addrs=[TCP_V4])), "12 0c 0a 0a 0a050d0302010a10903f"),
    # An empty marker in the protocol oneof: protocol_hint (6) = 32 02, h2 (1) = 0a 00.
    ("hint-h2", D.WeightedAddr(protocol_hint=D.ProtocolHint(h2=D.ProtocolHint.H2())), "32 02 0a 00"),
    # identity: 0a 36 (54); token: 12 c8 01 (200 = 0x48 | 0x80, then 1); csr: 1a 04.
    (
        "certify-request",
        identity_pb2.CertifyRequest(identity=IDENTITY, token=TOKEN, certificate_signing_request=CSR),
        "0a 36" + IDENTITY.encode().hex() + "12 c801" + TOKEN.hex() + "1a 04 3082010a",
    ),
    # valid_until (3) = Timestamp{seconds: 1700000000}: varint 80 e2 cf aa 06.
    (
        "certify-response",
        identity_pb2.CertifyResponse(
            leaf_certificate=b"LEAF",
            intermediate_certificates=[b"I1", b"I2"],
            valid_until=Timestamp(seconds=1_700_000_000),
        ),
        "0a 04 4c454146 12 02 4931 12 02 4932 1a 06 08 80e2cfaa06",
    ),
    # Transport header bodies (proxy.md 6.1): port 4040 = 08 c8 1f; session_protocol = 1a 02.
    (
        "header-http2",
        transport_pb2.Header(port=4040, session_protocol=transport_pb2.SessionProtocol(http2={})),
        "08 c81f 1a 02 12 00",
    ),
    (
        "header-http1",
        transport_pb2.Header(port=4040, session_protocol=transport_pb2.SessionProtocol(http1={})),
        "08 c81f 1a 02 0a 00",
    ),
    ("header-opaque", transport_pb2.Header(port=4040), "08 c81f"),
]


@pytest.mark.parametrize(("message", "wire"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_encodes_to_and_decodes_from_golden_bytes(message: Message, wire: str) -> None:
    golden = bytes.fromhex(wire)
    assert message.SerializeToString(deterministic=True) == golden
    assert type(message).FromString(golden) == message


def test_certify_request_decodes_field_by_field() -> None:
    golden = bytes.fromhex("0a 36" + IDENTITY.encode().hex() + "12 c801" + TOKEN.hex() + "1a 04 3082010a")
    request = identity_pb2.CertifyRequest.FromString(golden)
    assert (request.identity, request.token, request.certificate_signing_request) == (IDENTITY, TOKEN, CSR)


def test_no_endpoints_false_is_present_though_empty() -> None:
    update = D.Update.FromString(bytes.fromhex("1a 00"))
    assert update.WhichOneof("update") == "no_endpoints"
    assert update.no_endpoints.exists is False
    assert D.Update.FromString(b"").WhichOneof("update") is None


PREFACE = b"transport.l5d.io/v1\r\n\r\n"
# preface (23 ASCII bytes), u32 big-endian length 7, then the Header body.
FULL_HEADER = (
    "7472616e73706f72742e6c35642e696f2f7631 0d0a0d0a"  # "transport.l5d.io/v1" CR LF CR LF
    "00000007"
    "08c81f 1a02 1200"
)


def test_complete_transport_header_from_the_worked_example() -> None:
    golden = bytes.fromhex(FULL_HEADER)
    assert len(PREFACE) == 23 and len(golden) == 23 + 4 + 7

    body = transport_pb2.Header(port=4040, session_protocol=transport_pb2.SessionProtocol(http2={}))
    encoded = body.SerializeToString()
    assert PREFACE + struct.pack(">I", len(encoded)) + encoded == golden

    assert golden.startswith(PREFACE)
    (length,) = struct.unpack(">I", golden[23:27])
    decoded = transport_pb2.Header.FromString(golden[27 : 27 + length])
    assert decoded.port == 4040
    assert decoded.name == ""
    assert decoded.session_protocol.WhichOneof("kind") == "http2"
    assert golden[27 + length :] == b""
