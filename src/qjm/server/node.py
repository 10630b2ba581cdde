"""JournalNode: wires journals on a data directory to the gRPC control plane and the TCP data plane."""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from dataclasses import replace
from typing import Any

import grpc

from qjm.addresses import advertised, check_bindable, is_loopback, join_host_port, split_host_port
from qjm.errors import (
    BindError,
    ConfigError,
    InsecureBindError,
    NotFoundError,
    PermissionDeniedError,
    QJMError,
    StorageError,
)
from qjm.protocol import convert
from qjm.protocol import qjournal_pb2 as pb
from qjm.protocol.download import verified_chunks
from qjm.protocol.messages import RemoteEditLog
from qjm.protocol.rpcmeta import GRPC_OPTIONS, add_servicer, make_stub, open_channel, server_credentials
from qjm.security.authz import Authorizer
from qjm.security.tls import TlsConfig
from qjm.server.data import DataServer
from qjm.server.http import CLIENT_AUTH, NodeHttpServer, https_context
from qjm.server.journal import Journal, JournalHooks
from qjm.server.limits import NodeLimits
from qjm.server.metrics import NodeMetrics
from qjm.server.registry import JournalRegistry
from qjm.server.rpc import QJournalServicer
from qjm.server.storage import journal_ids_on_disk
from qjm.server.syncer import JournalSyncer, RateLimit

log = logging.getLogger("qjm.node")


def fetch_segment(
    source: str, journal_id: str, segment: int, timeout: float = 60.0, *, tls: TlsConfig | None = None
) -> Iterator[bytes]:
    """Download a segment from another node's control plane, a chunk at a time as it arrives
    (design §4.3), verifying at the end what its sender vouched for. ``timeout`` bounds each wait
    for a chunk, not the whole download, which may be gigabytes. With ``tls`` the download is
    mutual TLS with this node's certificate, and ``source`` must hold a certificate of the same CA
    for the host named (design §9.3)."""
    with open_channel(source, GRPC_OPTIONS, tls) as ch:
        stub = make_stub(ch)
        messages = stub.DownloadSegment(pb.SegmentRequest(journal_id=journal_id, segment_txid=segment))
        try:
            yield from verified_chunks(_each_within(messages, timeout), f"download of segment {segment} from {source}")
        except grpc.RpcError as e:
            raise NotFoundError(f"download of segment {segment} from {source} failed: {e.details()}") from e
        finally:
            messages.cancel()


def peer_manifest(
    peer: str, journal_id: str, in_progress_ok: bool, timeout: float = 30.0, *, tls: TlsConfig | None = None
) -> list[RemoteEditLog]:
    """A peer's segments of ``journal_id`` (catch-up's comparison, Hadoop's getEditLogManifestFromJournal),
    over mutual TLS with this node's certificate when ``tls`` is given."""
    with open_channel(peer, GRPC_OPTIONS, tls) as ch:
        req = pb.ManifestRequest(journal_id=journal_id, since_txid=1, in_progress_ok=in_progress_ok)
        try:
            return list(convert.manifest_from_pb(make_stub(ch).GetEditLogManifest(req, timeout=timeout)).logs)
        except grpc.RpcError as e:
            raise NotFoundError(f"{peer} did not list journal {journal_id}: {e.details()}") from e


def _each_within(messages: Any, timeout: float) -> Iterator[pb.SegmentChunk]:
    """The messages of a server stream (gRPC's iterator, which has ``cancel``), cancelling it when
    one takes longer than ``timeout``."""
    timer = threading.Timer(timeout, messages.cancel)
    timer.start()
    try:
        for m in messages:
            timer.cancel()
            yield m
            timer = threading.Timer(timeout, messages.cancel)
            timer.start()
    finally:
        timer.cancel()


def peer_fetcher(
    peers: Iterable[str], fetch: Callable[[str, str, int], Iterable[bytes]]
) -> Callable[[str, str, int], Iterable[bytes]]:
    """``fetch`` restricted to the nodes in ``peers`` (``HOST:PORT`` control addresses): a recovery
    naming any other source is refused before anything is dialled (design §9.3)."""
    allowed = frozenset(join_host_port(*split_host_port(p, what="peer address")) for p in peers)

    def fetch_from_peer(source: str, journal_id: str, segment: int) -> Iterable[bytes]:
        try:
            named = join_host_port(*split_host_port(source, what="recovery source"))
        except QJMError:
            named = ""
        if named not in allowed:
            raise PermissionDeniedError(
                f"recovery source {source!r} is not one of this node's peers; segment {segment} not downloaded"
            )
        return fetch(source, journal_id, segment)

    return fetch_from_peer


def refuse_plaintext_beyond_loopback(hosts: Iterable[str], tls: TlsConfig | None, insecure: bool) -> None:
    """Raise ``InsecureBindError`` if a node without TLS would listen on a non-loopback host and
    was not told ``insecure`` (design §9.1)."""
    if tls is not None or insecure:
        return
    exposed = sorted({h or "0.0.0.0" for h in hosts if not is_loopback(h)})
    if exposed:
        raise InsecureBindError(
            f"refusing to serve without TLS on {', '.join(exposed)}: anyone reaching it could read, write, fence "
            "or format any journal; give tls_ca, tls_cert and tls_key (docs/configuration.md), or --insecure"
        )


class JournalNode:
    """One node: any number of journals under ``data_dir``, each created by ``Format``.

    ``host`` is where both ports listen (``data_host`` moves the data plane elsewhere); the
    ``*_advertise`` addresses (``host`` or ``host:port``) are what clients are told, by default
    the bind address; a wildcard bind advertises no host (qjm.addresses).

    ``peers`` are the control addresses of the journal's nodes (the same list on every node; a node
    skips its own address). Recovery downloads only from them (design §9.3), and with
    ``sync_interval`` > 0 a thread runs a catch-up round from them every ``sync_interval`` seconds
    (design §4.4), downloading at most ``sync_bandwidth`` bytes a second (0: no limit).

    The data directory is locked (``<data_dir>/in_use.lock``) for the node's life: a second node
    on it refuses to start. A node that fails to start releases everything it took (ports, lock).

    With ``tls`` the control plane requires mutual TLS and ``authz`` decides what each identity may
    do (design §9); without it a node listens only on loopback unless ``insecure``. With ``tls`` the
    HTTP port serves HTTPS, a client certificate of the CA ``http_client_auth`` ("optional" or
    "required"; design §9.5).
    """

    def __init__(
        self,
        data_dir: str,
        *,
        host: str = "127.0.0.1",
        rpc_port: int = 0,
        data_port: int = 0,
        data_host: str | None = None,
        rpc_advertise: str | None = None,
        data_advertise: str | None = None,
        hooks: JournalHooks | None = None,
        fetcher: Callable[[str, str, int], Iterable[bytes]] | None = None,
        rpc_workers: int = 16,
        http_port: int | None = None,
        http_host: str | None = None,
        http_client_auth: str = "optional",
        limits: NodeLimits | None = None,
        tls: TlsConfig | None = None,
        authz: Authorizer | None = None,
        insecure: bool = False,
        peers: Iterable[str] | None = None,
        sync_interval: float = 120.0,
        sync_bandwidth: int = 0,
    ) -> None:
        self.host = host
        self.tls = tls.check() if tls is not None else None
        self.data_host = host if data_host is None else data_host
        refuse_plaintext_beyond_loopback((host, self.data_host), tls, insecure)
        fetch = fetcher if fetcher is not None else functools.partial(fetch_segment, tls=tls)
        if peers is not None:
            fetch = peer_fetcher(peers, fetch)
        advertised(host, rpc_port, rpc_advertise)  # a bad advertised address fails before any port is taken
        advertised(self.data_host, data_port, data_advertise)
        self.data_dir = os.path.abspath(data_dir)
        self.http_host = host if http_host is None else http_host
        self.http_client_auth = http_client_auth
        check_bindable(host, rpc_port, "control plane")
        check_bindable(self.data_host, data_port, "data plane")  # before gRPC holds the other port
        if http_port is not None:
            check_bindable(self.http_host, http_port, "HTTP port")
        # The HTTP port serves HTTPS with the node's certificate when the node has TLS (design §9.5).
        if http_client_auth not in CLIENT_AUTH:
            raise ConfigError(f"http_client_auth must be one of {', '.join(CLIENT_AUTH)}, got {http_client_auth!r}")
        if self.tls is None and http_client_auth != "optional":
            raise ConfigError(f"http_client_auth = {http_client_auth} needs TLS (tls_ca, tls_cert, tls_key)")
        http_tls = https_context(self.tls, http_client_auth) if self.tls is not None else None
        self.limits = (limits or NodeLimits()).fitted_to_descriptors()
        self.load_failures: dict[str, str] = {}  # journal id -> why its directory did not load
        self._lock_fd = lock_data_dir(self.data_dir)
        data_server: DataServer | None = None
        self.http: NodeHttpServer | None = None
        try:
            self.journals = JournalRegistry(
                self.data_dir, max_open=self.limits.max_open_journals, fetcher=fetch, hooks=hooks,
                on_open=self._on_open,
            )  # fmt: skip
            data_server = DataServer((self.data_host, data_port), self.journals, self.limits, tls=self.tls)
            data = data_server  # bound for the lambda: the attribute is set once the node is up
            self.metrics = NodeMetrics(
                self.data_dir, self.loaded_journals, lambda: dict(self.load_failures), self._info,
                lambda: {"tls": data.tls_refusals, "limit": data.refused_connections},
                lambda: self.http.refused() if self.http is not None else {},
            )  # fmt: skip
            # ``http_port`` None: no HTTP port (library use); 0: any free port. It listens on ``host``
            # unless ``http_host`` says otherwise (Hadoop's dfs.journalnode.http-bind-host).
            if http_port is not None:
                self.http = NodeHttpServer(
                    self.http_host, http_port, self.metrics, tls=http_tls, timeout=self.limits.hello_timeout,
                    max_connections=self.limits.max_http_connections,
                )  # fmt: skip
            # The control port is bound last: gRPC keeps a port it bound until the server has run,
            # so nothing may fail after it (Hadoop's HDFS-12407: a failed start kept its RPC port).
            # A connection that has not finished its handshake (TLS included) within the data plane's
            # hello_timeout is closed: a stalled or garbage handshake holds nothing for long.
            handshake_ms = int(self.limits.hello_timeout * 1000)
            self._grpc = grpc.server(
                futures.ThreadPoolExecutor(max_workers=rpc_workers),
                options=[*GRPC_OPTIONS, ("grpc.server_handshake_timeout_ms", handshake_ms)],
            )
            # Each node counts its own refusals, whatever Authorizer it was given.
            self.authz = replace(authz or Authorizer(), on_denied=[self.metrics.count_denied])
            data_server.authz = self.authz  # the data plane checks the writer role (design §9.4)
            servicer = QJournalServicer(
                self.journals, lambda: self.data_address, self.authz, max_followers=max(1, rpc_workers // 2)
            )
            add_servicer(servicer, self._grpc)
            try:
                where = join_host_port(host, rpc_port)
                if tls is None:
                    self.rpc_port = self._grpc.add_insecure_port(where)
                else:
                    self.rpc_port = self._grpc.add_secure_port(where, server_credentials(tls))
            except RuntimeError:  # taken between the check and here; gRPC says no more than this
                self.rpc_port = 0
            if self.rpc_port == 0:
                raise BindError(f"cannot bind the control plane to {join_host_port(host, rpc_port)}")
        except BaseException:
            if self.http is not None:
                self.http.stop()
            if data_server is not None:
                data_server.server_close()
            unlock_data_dir(self._lock_fd)
            raise
        self.data_server = data_server
        self.data_port = self.data_server.server_address[1]
        self._data_thread: threading.Thread | None = None
        self.rpc_address = advertised(host, self.rpc_port, rpc_advertise)
        self.data_address = advertised(self.data_host, self.data_port, data_advertise)
        # Catch-up (design §4.4): the same peer list may be given to every node; each skips itself.
        own = {self.rpc_address, self.rpc_bind_address}
        self.sync_peers = [p for p in peers or () if p not in own]
        self.sync_interval = sync_interval
        self._sync_limit = RateLimit(sync_bandwidth)
        self._syncers: dict[str, JournalSyncer] = {}
        self._fetcher = fetch
        self._peer_manifest = functools.partial(peer_manifest, tls=tls)
        self._sync_stop = threading.Event()
        self._sync_thread: threading.Thread | None = None

    @property
    def rpc_bind_address(self) -> str:
        return join_host_port(self.host, self.rpc_port)

    @property
    def data_bind_address(self) -> str:
        return join_host_port(self.data_host, self.data_port)

    @property
    def http_address(self) -> str | None:
        return join_host_port(self.http_host, self.http.port) if self.http is not None else None

    def _info(self) -> dict[str, str]:
        http = self.http_address or ""
        return {"rpc_address": self.rpc_address, "data_address": self.data_address, "http_address": http}

    def loaded_journals(self) -> list[Journal]:
        return self.journals.open_journals()

    def load_journals(self) -> None:
        """Open every journal on disk now, so that one that cannot load is known (and logged, and
        reported by /health) before a writer needs it; a later successful open clears it."""
        for jid in journal_ids_on_disk(self.data_dir):
            try:
                with self.journals.lease(jid):
                    pass
            except (QJMError, OSError) as e:
                self.load_failures[jid] = f"{type(e).__name__}: {e}"
                log.error("journal %s did not load: %s: %s", jid, type(e).__name__, e)

    def _on_open(self, j: Journal) -> None:
        self.load_failures.pop(j.journal_id, None)
        _log_loaded(j)

    def start(self) -> JournalNode:
        self.load_journals()
        self._grpc.start()
        self._data_thread = self.data_server.start()
        if self.http is not None:
            self.http.start()
        if self.sync_peers and self.sync_interval > 0:
            self._sync_thread = threading.Thread(target=self._sync_loop, name="qjm-sync", daemon=True)
            self._sync_thread.start()
        log.info(
            "JournalNode serving %s: control %s (advertised %s, %s), data %s (advertised %s), http %s",
            self.data_dir, self.rpc_bind_address, self.rpc_address, self._security(), self.data_bind_address,
            self.data_address, self._http_description(),
        )  # fmt: skip
        return self

    def _http_description(self) -> str:
        if self.http is None:
            return "off"
        if self.http.scheme == "http":
            return f"{self.http_address} (plaintext)"
        return f"{self.http_address} (HTTPS, client certificates {self.http_client_auth})"

    def _security(self) -> str:
        if self.tls is None:
            return "plaintext, no authentication"
        if not self.authz.enforcing:
            return "mutual TLS; no [authz] table: every certificate of the CA may do everything"
        return f"mutual TLS, {len(self.authz.grants or {})} identities granted"

    def sync_round(self) -> int:
        """One catch-up round for every journal on disk; returns the segments installed."""
        installed = 0
        for jid in journal_ids_on_disk(self.data_dir):
            if self._sync_stop.is_set():
                break
            try:
                with self.journals.lease(jid) as j:
                    syncer = self._syncers.get(jid)
                    if syncer is None or syncer.journal is not j:  # a journal closed and opened again
                        syncer = self._syncers[jid] = JournalSyncer(
                            j, self.sync_peers, self._peer_manifest, self._fetcher, limit=self._sync_limit
                        )
                    installed += syncer.run_once()
            except QJMError as e:
                log.warning("catch-up of journal %s skipped: %s: %s", jid, type(e).__name__, e)
        return installed

    def _sync_loop(self) -> None:
        while not self._sync_stop.wait(self.sync_interval):
            try:
                self.sync_round()
            except Exception:
                log.exception("catch-up round failed")

    def stop(self, grace: float | None = None) -> None:
        self._sync_stop.set()
        if self.http is not None:
            self.http.stop()
        self.data_server.shutdown()
        self.data_server.server_close()
        self._grpc.stop(grace).wait()
        self.data_server.close_connections()
        if self._sync_thread is not None:
            self._sync_thread.join(timeout=(grace or 0) + 30)
        self.journals.close_all()
        if self._lock_fd >= 0:
            unlock_data_dir(self._lock_fd)
            self._lock_fd = -1

    def wait(self) -> None:
        self._grpc.wait_for_termination()


def _log_loaded(j: Journal) -> None:
    st = j.peek_state()
    if st is None:
        log.info("loaded journal %s (%s): not formatted", j.journal_id, j.storage.describe())
        return
    log.info(
        "loaded journal %s (%s): promised epoch %d, writer epoch %d, last txid %d, committed %d, open segment %s",
        j.journal_id, j.storage.describe(), st.last_promised_epoch, st.last_writer_epoch, st.highest_written_txid,
        st.committed_txid, st.open_segment_txid or "none",
    )  # fmt: skip


def lock_data_dir(data_dir: str) -> int:
    """Create ``data_dir`` if needed and take its exclusive lock; the fd holds it.

    Raises ``StorageError`` naming the directory (and the holder's pid, when it wrote one) if
    another node has it, or if the directory cannot be created or locked.
    """
    path = os.path.join(data_dir, "in_use.lock")
    try:
        os.makedirs(data_dir, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise StorageError(f"cannot use data directory {data_dir}: {e.strerror or e}") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        raise StorageError(
            f"data directory {data_dir} is in use by another JournalNode"
            + (f" (pid {holder})" if holder.isdigit() else "")
            + f": {e.strerror}; one directory serves one node"
        ) from e
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def unlock_data_dir(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
