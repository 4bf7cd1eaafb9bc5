"""Sans-IO parsers of the proxy: bytes in, events out; no asyncio, sockets or ssl."""
