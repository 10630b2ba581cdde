"""Mutual TLS and authorization: certificates (``certs``), TLS contexts and gRPC credentials
(``tls``), and the identity → role check every request passes (``authz``). Design §9."""
