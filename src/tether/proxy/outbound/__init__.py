"""The outbound proxy: discovery (``discovery``), endpoint metadata (``endpoint``), the balancer
(``balancer``) and the connection layer (``layer``) that puts them together per connection."""
