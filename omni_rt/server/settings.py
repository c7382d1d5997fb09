"""Server settings (pydantic): CLI flags and OMNI_RT_* environment variables map onto these fields."""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class ServerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="OMNI_RT_", extra="forbid")

    host: str = "127.0.0.1"
    port: int = 8000
    preset: str = "cpu"
    thinker: str | None = Field(None, description="the thinker instead of the preset's: a .gguf path or an "
                                "http(s)://HOST:PORT/v1 OpenAI-compatible server (omni_rt.engine.weights.thinker_choice)")
    thinker_api_key: str | None = Field(None, description="bearer token for a --thinker URL")
    api_key: str | None = Field(None, description="require 'Authorization: Bearer KEY' (or ?token=KEY for browsers)")
    allowed_origins: list[str] = Field(default_factory=list, description="browser Origins allowed; empty = any")
    max_sessions: int = Field(32, ge=1, description="concurrent sessions; one more is closed with 1013")
    max_message_bytes: int = Field(2 * 1024 * 1024, ge=1024, description="larger WebSocket messages close with 1009")
    idle_timeout_s: float = Field(300.0, gt=0, description="close a session with no client message for this long")
    max_buffered_audio_s: float = Field(120.0, gt=0, description="cap on uncommitted input audio per session")
    max_response_tokens: int = Field(96, ge=1, le=4096, description="cap on tokens per spoken answer")
    speculative_responses: bool = Field(True, description="start answering from the transcript decoded in the "
                                        "end-of-turn silence; release it when the turn ends as guessed")
    tool_preamble: Literal["auto", "off"] = Field("auto", description="a spoken answer that calls a tool first says a "
                                                  "short phrase fitting the call when the model wrote no words before "
                                                  "it (no dead air while the tool runs); 'off': the call alone")
    live_delegation: Literal["auto", "always", "off"] = Field("off", description="GPT-Live client delegation "
                                                              "(/v1/live/sessions): 'auto' the voice thinker decides "
                                                              "when to delegate (its function in every prompt costs "
                                                              "first-audio time), 'always' every user turn is "
                                                              "delegated, 'off' never (docs/benchmarks/gpt-live.md)")
    delegate: str | None = Field(None, description="GPT-Live Responses delegation: http(s)://HOST:PORT/v1 of the "
                                 "OpenAI-compatible server (chat completions) that runs delegated requests; without "
                                 "it a session asking for delegation type 'responses' is refused")
    delegate_api_key: str | None = Field(None, description="bearer token for the --delegate server")
    backchannel_filter: bool = Field(True, description="speech over an answer being heard is decided (backchannel "
                                     "or interruption) before it barges in; False: every speech start barges in at "
                                     "once (the preset's asr stage 'backchannel_filter' turns it off too)")
    send_timeout_s: float = Field(10.0, gt=0, description="a client whose socket accepts nothing for this long is "
                                  "closed (1008) and its answer freed")
    ping_interval_s: float = Field(20.0, gt=0, description="WebSocket keepalive: the server pings every client "
                                   "this often and closes (1011) one that has not answered within as long again "
                                   "(a vanished peer, or one that stopped reading before its socket filled)")
    max_outgoing_bytes: int = Field(16 * 1024 * 1024, ge=65536, description="cap on events queued for one client")
    max_connections: int | None = Field(None, ge=2, description="connections held at once (HTTP + WebSocket); "
                                        "default: derived from the file limit (RLIMIT_NOFILE) after the descriptors "
                                        "the models and engine need, see omni_rt/server/connections.py; a value "
                                        "only lowers it. Over it the oldest connection without a request is closed "
                                        "to make room, or, all busy, the newcomer gets 503")
    connect_timeout_s: float = Field(5.0, gt=0, description="a connection must complete its request headers (a "
                                     "request or a WebSocket upgrade) this long after connecting or after its last "
                                     "response, however slowly it sends, or it is closed")
    random_weights: Literal["full", "tiny"] | None = Field(None, description="random weights of the real shapes on "
                                                           "every stage that supports it ('tiny': shrunk, for CPU)")
    shutdown_grace_s: float = Field(5.0, ge=0, description="time open answers get to finish at shutdown")
    blas_threads: int = Field(1, ge=1, description="threads of numpy's BLAS pool (OpenBLAS) in the server process: "
                              "its idle worker spins ~100 ms after every call, while the server's only BLAS work is "
                              "tiny (Whisper's mel filter, ~0.5 ms a decode)")
    webrtc_media_timeout_s: float = Field(15.0, gt=0, description="end a WebRTC call when no audio arrives from the "
                                          "peer for this long (a peer that vanished without hanging up)")
    webrtc_connect_timeout_s: float = Field(10.0, gt=0, le=120, description="a WebRTC call must connect (ICE and "
                                            "DTLS, or its data channel open) this long after its offer is answered, "
                                            "or it is freed; until then it holds no session")
    webrtc_max_pending_calls: int = Field(32, ge=1, description="WebRTC calls answered but not yet connected, at "
                                          "once; one more offer is refused with 503 too_many_pending_calls")
    webrtc_max_pending_per_client: int = Field(8, ge=1, description="of those, from one source IP address (loopback "
                                               "too); one more offer is refused with 429 rate_limit_exceeded")
    webrtc_hosts: list[str] = Field(default_factory=list, description="IP addresses a WebRTC call's UDP sockets "
                                    "bind and offer as ICE host candidates; empty = every interface address but "
                                    "loopback (aioice's own gathering). 127.0.0.1 keeps calls on this machine")
    webrtc_advertise_address: str | None = Field(None, description="IP address offered in the SDP answer instead of "
                                                 "the bound one (behind a 1:1 NAT: the public address; forward the "
                                                 "UDP port range to the bound address)")
    webrtc_port_min: int | None = Field(None, ge=1, le=65535, description="lowest UDP port of WebRTC calls' sockets "
                                        "(with webrtc_port_max); default: any port the kernel picks")
    webrtc_port_max: int | None = Field(None, ge=1, le=65535, description="highest UDP port of WebRTC calls' sockets; "
                                        "a call takes one port per host address, refused with 503 when none is free")

    @field_validator("webrtc_hosts")
    @classmethod
    def _bindable(cls, hosts: list[str]) -> list[str]:
        for host in hosts:
            if ipaddress.ip_address(host).is_unspecified:  # a ValueError names a hostname or a typo
                raise ValueError(f"{host} is not one address: give each interface address to bind")
        return hosts

    @field_validator("webrtc_advertise_address")
    @classmethod
    def _an_address(cls, address: str | None) -> str | None:
        if address is not None and ipaddress.ip_address(address).is_unspecified:
            raise ValueError(f"{address} cannot be reached: give the address peers send to")
        return address

    @model_validator(mode="after")
    def _port_range(self) -> "ServerSettings":
        if (self.webrtc_port_min is None) != (self.webrtc_port_max is None):
            raise ValueError("webrtc_port_min and webrtc_port_max go together")
        if self.webrtc_port_min is not None and self.webrtc_port_min > self.webrtc_port_max:
            raise ValueError(f"webrtc_port_min {self.webrtc_port_min} is above webrtc_port_max {self.webrtc_port_max}")
        return self
