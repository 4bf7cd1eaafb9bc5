"""The inbound proxy: the connection layer (``layer``) and the default policies (``policy``)."""
