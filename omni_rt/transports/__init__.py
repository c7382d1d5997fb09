"""Transports: thin adapters that move bytes between a connection and a sans-I/O session (WebSocket, Twilio)."""
