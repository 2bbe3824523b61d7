/**
 * The one file that reads private fields of other libraries (test/architecture.test.ts refuses such a read
 * anywhere else in src/). Each accessor below names the library and the versions it was read from, why the
 * gateway needs the field, why no public API does, and what happens when a library upgrade removes it: the
 * accessor then returns undefined (never throws, never guesses), logs once at error level naming the field, and
 * its callers take the fallback written here. test/internals.test.ts checks both halves: that each field is still
 * there on the libraries installed (an upgrade that drops one fails it), and that an object without the field gets
 * the fallback.
 *
 * It is a leaf, below net/, stream/ and agent/: Node's TLSSocket._parent is read by net/tls.ts and by
 * stream/reset.ts, and net/ imports stream/ (stream/meta.ts), so a file in net/ could not serve stream/.
 */
import { createRequire } from 'node:module';
import type { Duplex } from 'node:stream';
import type { TLSSocket } from 'node:tls';
import type { Connection as SshConnection, SFTPWrapper } from 'ssh2';
import { GatewayError } from './errors.js';
import { logger } from './log.js';

const reported = new Set<string>();

/** Logs once per field that a library no longer has it (the caller's fallback follows). */
function missing(field: string, fallback: string): undefined {
  if (!reported.has(field)) {
    reported.add(field);
    logger('internals').error({ field, fallback }, `${field} is missing (a library upgrade?): ${fallback}`);
  }
  return undefined;
}

function isStream(value: unknown): value is Duplex {
  return typeof value === 'object' && value !== null && typeof (value as { on?: unknown }).on === 'function' && typeof (value as { destroy?: unknown }).destroy === 'function';
}

// --- Node's tls (Node 20 to 24, lib/_tls_wrap.js) ----------------------------------------------------------------

/**
 * TLSSocket._parent: the net.Socket a TLSSocket was made on (tls.Server's socket for a socket handed to it with
 * emit('connection'), or our own `new TLSSocket(socket)`; null when Node wrapped another kind of stream). Why:
 * the servers we feed our streams to (net/tls.ts tlsTerminator, the web port's HTTP/2 server in net/http2.ts) hand
 * back only the TLS socket, and the deadlines and the client's address are the stream's; resetStream
 * (stream/reset.ts) resets the stream under a TLS socket, since TLS has no abort of its own. Public alternative:
 * none; Node documents no link from a TLSSocket to its stream. Fallback: undefined; tlsTerminator and the web port
 * then refuse the connection (a connection without its deadlines is not served), and resetStream only destroys
 * the TLS socket (its far side sees an end, not a reset).
 */
export function tlsSocketParent(socket: TLSSocket): Duplex | undefined {
  if (!('_parent' in socket)) return missing('TLSSocket._parent', 'TLS connections handed to a tls.Server are refused; a reset TLS socket ends instead');
  // null: Node wrapped no net.Socket (tls.connect's own socket, or a stream that is not a net.Socket).
  const parent: unknown = socket._parent;
  return isStream(parent) ? parent : jsStreamOf(socket);
}

/**
 * TLSSocket._handle._parentWrap.stream: the stream that is not a net.Socket (a connection upgrade's WebSocket
 * stream) a tls.Server's TLSSocket was made on, through Node's JSStreamSocket (lib/internal/js_stream_socket.js,
 * whose `stream` is the stream it wraps). Why, public alternative: as _parent above, for the web port's TLS on a
 * stream that came through the transport upgrade. Fallback: undefined; the web port then refuses such a
 * connection (the other routes terminate TLS with their own TLSSocket and do not need it).
 */
function jsStreamOf(socket: TLSSocket): Duplex | undefined {
  const handle = (socket as unknown as { _handle?: { _parentWrap?: { stream?: unknown } } | null })._handle;
  if (!handle) return undefined; // a socket already closed, or tls.connect's own: nothing wrapped
  if (!('_parentWrap' in handle)) return missing('TLSSocket._handle._parentWrap', 'the web API through the connection upgrade is refused');
  const stream = handle._parentWrap?.stream;
  return isStream(stream) ? stream : undefined;
}

/** What tlsVerifyResult found: the error OpenSSL recorded for the peer's certificate, or null (verified). */
export type TlsVerifyResult = { error: (Error & { code?: string }) | null };

/**
 * TLSSocket._handle.verifyError(): OpenSSL's verdict on the client certificate of a handshake. Why: a TLSSocket
 * made by hand (net/tls.ts terminateTls) is not checked the way tls.Server checks its own, so we set .authorized
 * and .authorizationError ourselves, from what tls.Server itself reads. Public alternative: none for the verdict
 * (checking the chain again in JavaScript would need the context's CAs, which a SecureContext does not give
 * back). Fallback: undefined, and the caller records the client as not verified (fail closed: every client
 * certificate is then refused, never accepted unchecked).
 */
export function tlsVerifyResult(socket: TLSSocket): TlsVerifyResult | undefined {
  const handle = (socket as unknown as { _handle?: { verifyError?: unknown } | null })._handle;
  if (typeof handle?.verifyError !== 'function') return missing('TLSSocket._handle.verifyError', 'client certificates of hand-made TLS sockets are refused');
  return { error: (handle.verifyError as () => (Error & { code?: string }) | null).call(handle) };
}

// --- ssh2 (1.x; read from 1.17.0, lib/server.js) -----------------------------------------------------------------

/**
 * A server Connection's _sock: the stream handed to Server.injectSocket(). Why: ssh2's 'connection' event comes
 * after the client's version line, with an address that is not the client's when a PROXY header or TLS came first,
 * and the stream carries its deadlines and what the caller attached to it (net/ssh.ts SshEndpoint, the agent's
 * SSH Service). Public alternative: one ssh2 Server per stream would pair them, at the cost of parsing the host
 * keys for every connection (ssh2's Server takes no parsed key). Fallback: undefined; SshEndpoint then ends the
 * connection at once (its handshake deadline could not be lifted, nor its origin told), and the agent's SSH
 * Service names the client by ssh2's address (a direct connection is then cut at its handshake deadline).
 */
export function sshConnectionStream(conn: SshConnection): Duplex | undefined {
  const sock = (conn as unknown as { _sock?: unknown })._sock;
  return isStream(sock) ? sock : missing('ssh2 Connection._sock', 'SSH connections are ended at once (Proxy) or named by address (agent)');
}

/**
 * A Channel's incoming.state ('open', 'eof', 'closed'; lib/Channel.js, set from the connection's CHANNEL_EOF and
 * CHANNEL_CLOSE before the channel pushes the end of its data). Not underscored, but not documented either. Why:
 * ssh2 ends a channel's readable side both on EOF and on a CLOSE without EOF (a dead connection's channels too);
 * net/sshchannel.ts tells the two apart so that a relay resets, not ends, the other side of a cut. Public
 * alternative: none (the 'eof' and 'close' events come after the end was pushed, or not at all). Fallback:
 * undefined, and the end is taken as clean (a cut v1 channel then passes on as an end, as before the check).
 */
export function sshChannelClosed(channel: object): boolean | undefined {
  const state = (channel as { incoming?: { state?: unknown } }).incoming?.state;
  if (typeof state !== 'string') return missing('ssh2 Channel.incoming.state', 'a v1 channel closed without EOF is relayed as an end');
  return state === 'closed';
}

/** The channel state ssh2's SFTP checks before each write (its `outgoing`). */
export interface SftpChannelState {
  id: number;
  state: 'open' | 'closing' | 'closed';
  window: number;
  packetSize: number;
}

type SftpConstructor = new (
  client: { _protocol: { _remoteIdentRaw: string; channelData(id: number, data: Buffer): void; channelClose(id: number): void } },
  chanInfo: { type: string; incoming: SftpChannelState; outgoing: SftpChannelState },
  cfg: { server: true },
) => SFTPWrapper & { push(data: Buffer | null): void };

/**
 * ssh2's SFTP class in server mode (lib/protocol/SFTP.js), on a plain pair of callbacks instead of an SSH channel.
 * Why: ssh2 has a complete SFTP v3 server-side parser and encoder but no public way to run it on anything but the
 * `sftp` subsystem of its own SSH sessions (agent/sftp/stdio.ts runs it on standard input and output). What is
 * used: `new SFTP(client, chanInfo, { server: true })`, whose constructor reads `client._protocol._remoteIdentRaw`
 * (the peer's version string: OpenSSH's, which decides SYMLINK's argument order) and keeps `chanInfo.outgoing`
 * (the channel state its writes check: `state` 'open', `window` and `packetSize`, `id`); it writes with
 * `client._protocol.channelData(id, bytes)` and gives up on a malformed packet with `channelClose(id)`; it is fed
 * with `push(chunk)` and `push(null)`. Public alternative: ssh2-streams' SFTPStream did this, but is ssh2's
 * deprecated predecessor; a second SFTP parser would be the worse choice. Fallback: GW_ERR_SFTP_UNAVAILABLE when
 * the class is gone, whose hint names the system's sftp-server (ssh_service.sftp_server).
 */
export function sftpServer(output: { data(bytes: Buffer): void; close(): void }, outgoing: SftpChannelState, load: () => unknown = loadSftpModule): SFTPWrapper & { push(data: Buffer | null): void } {
  let SFTP: unknown;
  try {
    SFTP = (load() as { SFTP?: unknown } | undefined)?.SFTP;
  } catch (err) {
    throw sftpUnavailable(err instanceof Error ? err.message : String(err));
  }
  if (typeof SFTP !== 'function') throw sftpUnavailable('ssh2/lib/protocol/SFTP.js exports no SFTP class');
  const protocol = {
    _remoteIdentRaw: 'SSH-2.0-OpenSSH',
    channelData: (_id: number, data: Buffer) => output.data(data),
    channelClose: () => output.close(),
  };
  return new (SFTP as SftpConstructor)({ _protocol: protocol }, { type: 'sftp', incoming: { ...outgoing }, outgoing }, { server: true });
}

function loadSftpModule(): unknown {
  return createRequire(import.meta.url)('ssh2/lib/protocol/SFTP.js');
}

function sftpUnavailable(why: string): GatewayError {
  return new GatewayError('GW_ERR_SFTP_UNAVAILABLE', `the built-in sftp-server cannot run: ${why}`);
}

// --- node-pty (1.x; read from 1.1.0, lib/unixTerminal.js) --------------------------------------------------------

/**
 * A terminal's master descriptor while it is open: node-pty's `fd` (public) and its `_socket`, the tty.ReadStream
 * on that descriptor. Why: node-pty's write() queues without limit and never says when the terminal is full; the
 * agent writes to the descriptor itself (agent/ssh.ts PtyWriter) and holds the client's input back. node-pty closes
 * the descriptor only by destroying _socket, which is marked destroyed first, so `isOpen()` false means no write
 * can reach a number the process has meanwhile given to another file. Public alternative: none for "is the
 * descriptor still ours". Fallback: undefined, and the agent uses node-pty's own write (no back-pressure).
 */
export function ptyMaster(term: unknown): { fd: number; isOpen(): boolean } | undefined {
  const t = term as { fd?: unknown; _socket?: { destroyed?: unknown } } | null | undefined;
  const socket = t?._socket;
  if (typeof t?.fd !== 'number' || typeof socket?.destroyed !== 'boolean') return missing('node-pty Terminal._socket', "terminal input goes through node-pty's own write, without back-pressure");
  return { fd: t.fd, isOpen: () => socket.destroyed === false };
}
