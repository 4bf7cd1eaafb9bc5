"""The destination component: indexes over services and pods, Get and GetProfile streams."""
