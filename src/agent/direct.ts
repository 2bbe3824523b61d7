/**
 * An agent that joined the Auth Service directly (self-hosted, `--auth-server`): it opens no reverse tunnel (the
 * Auth Service serves no /webapi/find, and no Proxy is named in its identity); instead the Proxy dials its
 * listeners, and the agent writes its own presence through the Auth API (src/agent/directpresence.ts).
 *
 *   SSH 3022 (ssh_service.listen_addr)                mutual TLS (the cluster's host CA on both sides: the caller
 *   Kubernetes 3026 (kube_service.listen_addr)        must be a Proxy of this cluster), then what a tunnel
 *   Windows Desktop 3028 (windows_desktop_service...)  channel carries: a DialRequest line, the DialAnswer line,
 *                                                    then for ssh the user's SSH connection, handed to the SSH
 *                                                    Service as a tunnel channel is (SshService.inject), else
 *                                                    the resource's bytes (resources.ts connectors)
 *
 * SSH rides inside mutual TLS too, not plain on 3022: locks, removals and the roles' node labels are decided by
 * the Proxy, and a plain listener would let a user with a still-valid SSH certificate skip them.
 *
 * Every listener is guarded (src/net/): caps per listener and per client address, a TLS handshake deadline, a
 * deadline for the dial request line (header_timeout), and the SSH handshake deadline. docs/tunnels.md.
 */
import type net from 'node:net';
import type { Duplex } from 'node:stream';
import type { TLSSocket } from 'node:tls';
import { formatHostPort, type HostPort } from '../addr.js';
import { identityFromCert } from '../auth/pki.js';
import { toGatewayError } from '../errors.js';
import { logger, type Logger } from '../log.js';
import { connectionOf, type ConnectionLimits } from '../net/deadlines.js';
import { closeServer, guardedServer, listenOn } from '../net/listen.js';
import { serverSecureContext, terminateTls } from '../net/tls.js';
import { readJsonLine, writeJsonLine } from '../stream/lines.js';
import { FramedStream } from '../stream/framed.js';
import { splice } from '../stream/splice.js';
import type { DialAnswer, DialRequest } from '../tunnel/protocol.js';
import { startAgentDial } from './dialhop.js';
import type { HostIdentity } from './identity.js';
import type { SshService } from './ssh.js';
import type { ResourceDialer } from './tunnel.js';

/** The dial request is one short JSON line. */
const MAX_REQUEST_BYTES = 16 * 1024;

export type DirectKind = 'ssh' | 'kube' | 'desktop';

export interface DirectListener {
  /** The bound address. */
  address: string;
  /** Serves the identity's certificate as it is now (after a renewal) to the next connections. */
  refresh(): void;
  close(): Promise<void>;
}

export interface DirectListenerOptions {
  kind: DirectKind;
  addr: HostPort;
  /** The configuration key, for listen errors. */
  configKey: string;
  identity: Pick<HostIdentity, 'key' | 'cert' | 'hostCa' | 'cluster' | 'hostId'>;
  connect: ResourceDialer;
  /** The SSH Service: required for kind ssh, gets the stream after the DialAnswer. */
  ssh?: Pick<SshService, 'injectDirect'>;
  limits: ConnectionLimits;
  log?: Logger;
}

/**
 * Why a TLS peer may not use a direct listener, or undefined when it may: it must present a host certificate
 * signed by the cluster's host CA (the only CA the listener trusts) for this cluster with the proxy role.
 */
export function refuseCaller(socket: TLSSocket, cluster: string): string | undefined {
  const peer = socket.getPeerCertificate();
  if (!peer?.raw) return 'no client certificate';
  if (!socket.authorized) return `the client certificate is not from this cluster's host CA (${String(socket.authorizationError)})`;
  let identity;
  try {
    identity = identityFromCert(peer.raw);
  } catch (err) {
    return (err as Error).message;
  }
  if (identity.kind !== 'host' || !identity.roles.includes('proxy')) return `a ${identity.kind} certificate without the proxy role (${identity.name})`;
  if (identity.cluster !== cluster) return `a certificate of cluster "${identity.cluster}"`;
  return undefined;
}

/** The SSH, Kubernetes or Windows Desktop listener of a direct-join agent. */
export async function startDirectListener(options: DirectListenerOptions): Promise<DirectListener> {
  const { kind, identity, limits } = options;
  const log = options.log ?? logger('direct');
  const settings = limits.settings;
  const contextNow = () => serverSecureContext({ key: identity.key, cert: identity.cert, ca: [identity.hostCa] }, `agent-${kind}`);
  let secureContext = contextNow();
  if (kind === 'ssh' && !options.ssh) throw new Error('the direct ssh listener needs the SSH Service');
  const server = guardedServer(limits.listener(`agent_${kind}`), (socket: net.Socket) => {
    terminateTls(socket, { secureContext, alpn: [], handshakeMs: settings.tlsHandshakeMs }, (tls) => void serve(tls, options, settings, log));
  });
  const address = await listenOn(server, options.addr, options.configKey);
  log.info({ addr: address, service: kind }, 'listening for the Proxy (direct-join agent)');
  return {
    address,
    refresh: () => {
      secureContext = contextNow();
    },
    close: () => closeServer(server),
  };
}

/** One connection after TLS: the caller check, the dial request, the resource. */
async function serve(socket: TLSSocket, options: DirectListenerOptions, settings: ConnectionLimits['settings'], log: Logger): Promise<void> {
  const headerMs = settings.headerMs;
  const client = `${socket.remoteAddress ?? '?'}:${socket.remotePort ?? 0}`;
  const refuse = (code: string, message: string) => {
    const answer: DialAnswer = { ok: false, error: { code, message } };
    socket.end(`${JSON.stringify(answer)}\n`);
  };
  const why = refuseCaller(socket, options.identity.cluster);
  if (why !== undefined) {
    log.warn({ client, service: options.kind, why }, 'direct listener: caller refused (only Proxies of this cluster may connect)');
    return refuse('GW_ERR_DIRECT_AUTH', `this agent accepts only Proxies of cluster "${options.identity.cluster}": ${why}`);
  }
  const conn = connectionOf(socket);
  conn.enter('route-header', headerMs);
  let request: DialRequest;
  try {
    request = await readJsonLine<DialRequest>(socket, { what: 'dial request', timeoutMs: headerMs, maxBytes: MAX_REQUEST_BYTES });
  } catch (err) {
    log.info({ client, service: options.kind, err: (err as Error).message }, 'direct listener: no valid dial request');
    // The line's own timer and the connection's deadline have the same length: whichever fires first, it is this
    // phase's deadline that passed, and it is counted once (the deadline's own expiry counts itself).
    if (toGatewayError(err).code === 'GW_ERR_TUNNEL_TIMEOUT') conn.count('route-header');
    socket.destroy();
    return;
  } finally {
    conn.leave('route-header');
  }
  if (request.service !== options.kind || typeof request.resource !== 'string') {
    return refuse('GW_ERR_TUNNEL_NOT_FOUND', `this listener serves ${options.kind} only, not ${String(request.service)}`);
  }
  if (options.kind === 'ssh') {
    // As through a tunnel channel: the answer, then the user's SSH connection for the SSH Service.
    startAgentDial(request, options.identity.hostId).end();
    writeJsonLine(socket, { ok: true } satisfies DialAnswer);
    options.ssh!.injectDirect(socket, settings.sshHandshakeMs, typeof request.client_src === 'string' ? request.client_src : undefined);
    return;
  }
  // This hop's span (dialhop.ts): the one a tunnel's channel starts, timing the dial to the resource.
  const hop = startAgentDial(request, options.identity.hostId);
  let target: Duplex;
  try {
    target = await options.connect(request, hop);
  } catch (err) {
    const e = toGatewayError(err);
    hop.fail(e.code);
    log.warn({ service: request.service, resource: request.resource, code: e.code, err: e.message }, 'cannot reach the resource');
    return refuse(e.code, e.message);
  } finally {
    hop.end();
  }
  const framed = request.framed === true;
  writeJsonLine(socket, (framed ? { ok: true, framed: true } : { ok: true }) satisfies DialAnswer);
  splice(framed ? new FramedStream(socket) : socket, target);
}

/**
 * What the agent advertises for a listener: the service's first public_addr (its port, or the listener's), else
 * the bound address (a wildcard host is replaced by the Auth Service with the address it sees the agent from).
 */
export function advertisedAddr(bound: string, publicAddrs: readonly { host: string; port?: number | undefined }[]): string {
  const first = publicAddrs[0];
  if (!first) return bound;
  const port = first.port ?? Number(bound.slice(bound.lastIndexOf(':') + 1));
  return formatHostPort(first.host, port);
}
