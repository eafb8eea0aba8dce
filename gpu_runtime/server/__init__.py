"""The runtime's HTTP server: OpenAI API, metrics, admin, overload handling."""
