"""The proxy's asyncio side: listeners, transports, connecting, pools, timers and control-plane clients."""
