"""Pure decisions of the proxy (routing, policy, retries, errors, labels); no asyncio, sockets or ssl."""
