/**
 * The Proxy's end of direct-join agents (agents that joined the Auth Service directly and open no tunnel): it
 * dials the listener the agent advertises in its presence record (Presence.direct, proxyId "direct") through the
 * Proxy's Dialer and hands back a stream that carries what a tunnel channel would after its DialAnswer:
 *
 *   ssh, kube, desktop: mutual TLS with the Proxy's host certificate; the agent's certificate must be the host
 *   certificate of the agent the presence names (not only any host of the cluster), with the system role of the
 *   service dialled (node, kube, desktop); then the DialRequest line out
 *   and the DialAnswer line back; after an ok answer the stream carries the user's SSH connection to the SSH
 *   Service (ssh, as a tunnel channel does) or the resource's bytes. SSH is never plain TCP: the agent's listener
 *   accepts only Proxies, so a user cannot skip the locks and roles the Proxy checks.
 *
 * Each accepted stream is tracked in auth.sessions under the agent's host identity, so a lock on the agent or its
 * removal closes what the Proxy has open to it, as it drops a tunnel agent's tunnel.
 *
 * The router (src/proxy/router.ts) takes dialDirect as its `direct` way to reach an agent. docs/tunnels.md.
 */
import { X509Certificate } from 'node:crypto';
import type { Duplex } from 'node:stream';
import type { PeerCertificate, TLSSocket } from 'node:tls';
import { parseAddr } from '../addr.js';
import { refusedDialHost } from '../auth/agentapi.js';
import { generateKeyPair, identityFromCert } from '../auth/pki.js';
import type { DirectAddrs, Presence } from '../auth/records.js';
import type { SessionRegistry } from '../auth/sessions.js';
import type { Dialer } from '../dial/dialer.js';
import { GatewayError, toGatewayError, type ErrorCode } from '../errors.js';
import { peerX509 } from '../net/tls.js';
import { FramedStream } from '../stream/framed.js';
import { readLine, writeJsonLine } from '../stream/lines.js';
import { connectTls } from '../stream/tls.js';
import { SERVICE_ROLE, type DialAnswer, type DialRequest, type ServiceKind } from '../tunnel/protocol.js';

export const DIRECT_DIAL_DEFAULTS = Object.freeze({ timeoutMs: 15_000 });

export interface DirectDialDeps {
  /** The Proxy's Dialer (HTTPS_PROXY / NO_PROXY apply as to every outbound dial). */
  dialer: Dialer;
  /** The Proxy's host certificate (cluster host CA, proxy role) and key: what the agent's listener accepts. */
  cert: string;
  key: string;
  /** The cluster's host CA: the agent's certificate must chain to it. */
  hostCa: string;
  /** One deadline for connecting, TLS and the agent's answer. Default 15 s. */
  timeoutMs?: number;
  /**
   * The Proxy's registry of open sessions (auth.sessions): each stream is tracked under the agent's host identity
   * (from its verified certificate), so a lock on the agent or its removal closes it, as it drops a tunnel.
   */
  sessions?: Pick<SessionRegistry, 'track'>;
}

const LISTENER: Partial<Record<ServiceKind, keyof DirectAddrs>> = { ssh: 'ssh', kube: 'kube', desktop: 'desktop' };

/**
 * The agent's certificate must be a host certificate for exactly this host ID, with the system role of the
 * service dialled (an Error for tls otherwise): a presence record says which listener is where, the certificate
 * says what its holder joined as.
 */
export function checkAgentCert(cert: Pick<PeerCertificate, 'raw'>, hostId: string, kind: keyof DirectAddrs): Error | undefined {
  try {
    const identity = identityFromCert(cert.raw);
    if (identity.kind !== 'host' || identity.name !== hostId) return new Error(`the certificate is for ${identity.kind} "${identity.name}", not agent ${hostId}`);
    const role = SERVICE_ROLE[kind];
    if (!identity.roles.includes(role)) return new Error(`the certificate of agent ${hostId} has the roles ${identity.roles.join(', ') || 'none'}, not ${role}: it did not join to serve ${kind}`);
    return undefined;
  } catch (err) {
    return err as Error;
  }
}

/** Dials a direct-join agent's listener for request; resolves with the stream once the agent accepted it. */
export function dialDirect(presence: Presence, request: DialRequest, deps: DirectDialDeps): Promise<Duplex> {
  const kind = LISTENER[request.service];
  const addr = kind ? presence.direct?.[kind] : undefined;
  const agent = `agent "${presence.nodename}" (${presence.hostId})`;
  if (!kind || !addr) {
    return Promise.reject(
      new GatewayError('GW_ERR_DIRECT_NO_LISTENER', `${agent} joined the Auth Service directly and advertises no ${request.service} listener`, {
        details: { hostId: presence.hostId, service: request.service },
      }),
    );
  }
  // The Auth Service refuses these when the presence is written; a record from before that check is refused here.
  let why: string | undefined;
  try {
    why = refusedDialHost(parseAddr(addr).host);
  } catch (err) {
    why = (err as Error).message;
  }
  if (why !== undefined) {
    return Promise.reject(
      new GatewayError('GW_ERR_DIRECT_ADDR_REFUSED', `${agent} advertises ${addr} for ${request.service}: the Proxy does not dial it (${why})`, {
        details: { hostId: presence.hostId, addr },
      }),
    );
  }
  const timeoutMs = deps.timeoutMs ?? DIRECT_DIAL_DEFAULTS.timeoutMs;
  const controller = new AbortController();
  let stream: Duplex | undefined;
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      controller.abort();
      stream?.destroy();
      reject(new GatewayError('GW_ERR_DIRECT_UNREACHABLE', `${agent} at ${addr}: its ${request.service} listener did not accept within ${timeoutMs} ms`, { details: { hostId: presence.hostId, addr } }));
    }, timeoutMs);
  });
  const attempt = (async () => {
    const raw = await deps.dialer.dial(addr, { signal: controller.signal }).catch((err: unknown) => {
      throw new GatewayError('GW_ERR_DIRECT_UNREACHABLE', `${agent} at ${addr}: ${toGatewayError(err).message}`, { cause: err, details: { hostId: presence.hostId, addr } });
    });
    stream = raw;
    const tls = await handshake(raw, addr, { hostId: presence.hostId, kind }, agent, deps);
    stream = tls;
    const open = await answer(tls, request, agent, timeoutMs);
    trackAgentStream(tls, request, deps);
    return open;
  })();
  attempt.catch(() => stream?.destroy());
  return Promise.race([attempt, deadline]).finally(() => clearTimeout(timer));
}

/** Tracks an accepted stream under the agent's certificate (checked by handshake) until it closes. */
function trackAgentStream(tls: TLSSocket, request: DialRequest, deps: DirectDialDeps): void {
  if (!deps.sessions) return;
  const identity = identityFromCert(peerX509(tls)!.raw);
  const untrack = deps.sessions.track(identity, `direct ${request.service} ${request.resource} for ${request.client_src}`, () => tls.destroy());
  tls.once('close', untrack);
  if (tls.destroyed) untrack();
}

async function handshake(raw: Duplex, addr: string, expected: { hostId: string; kind: keyof DirectAddrs }, agent: string, deps: DirectDialDeps): Promise<TLSSocket> {
  const { hostId } = expected;
  try {
    return await connectTls(raw, {
      host: parseAddr(addr).host,
      ca: deps.hostCa,
      cert: deps.cert,
      key: deps.key,
      checkServerIdentity: (_host, cert) => checkAgentCert(cert, hostId, expected.kind),
    });
  } catch (err) {
    throw new GatewayError('GW_ERR_DIRECT_AUTH', `mutual TLS with ${agent} at ${addr} failed: ${(err as Error).message}`, { cause: err, details: { hostId, addr } });
  }
}

/** Sends the DialRequest and reads the DialAnswer: the stream on ok, else the agent's refusal as an error. */
async function answer(tls: TLSSocket, request: DialRequest, agent: string, timeoutMs: number): Promise<Duplex> {
  // Framed (src/stream/framed.ts): an agent killed mid-transfer (its kernel's FIN) is a break here, not an end.
  writeJsonLine(tls, request.service === 'ssh' ? request : { ...request, framed: true });
  const line = await readLine(tls, { what: 'dial answer', timeoutMs, maxBytes: 64 * 1024 });
  let parsed: DialAnswer;
  try {
    parsed = JSON.parse(line) as DialAnswer;
  } catch {
    throw new GatewayError('GW_ERR_TUNNEL_PROTOCOL', `${agent} answered the dial request with a line that is not JSON`);
  }
  if (parsed?.ok === true) return parsed.framed === true ? new FramedStream(tls) : tls;
  tls.destroy();
  const code = parsed?.error?.code;
  const message = String(parsed?.error?.message ?? 'refused');
  const mine: ErrorCode = code === 'GW_ERR_DIRECT_AUTH' ? 'GW_ERR_DIRECT_AUTH' : code === 'GW_ERR_TUNNEL_NOT_FOUND' ? 'GW_ERR_TUNNEL_NOT_FOUND' : 'GW_ERR_TUNNEL_DIAL_FAILED';
  throw new GatewayError(mine, `${agent} cannot reach ${request.service} "${request.resource}": ${message}`, { details: { resource: request.resource, agentCode: code } });
}

/**
 * dialDirect with this Proxy's own client credentials: a host certificate for its host ID, issued once on first
 * use (the web certificate may be the operator's, from a public CA, which the agents do not accept).
 */
export function directDialer(
  issue: (publicKeyPem: string) => Promise<string>,
  base: Omit<DirectDialDeps, 'cert' | 'key'>,
): (presence: Presence, request: DialRequest) => Promise<Duplex> {
  let creds: Promise<{ cert: string; key: string }> | undefined;
  const credentials = () =>
    (creds ??= (async () => {
      const keys = generateKeyPair();
      return { key: keys.privateKeyPem, cert: await issue(keys.publicKeyPem) };
    })().catch((err: unknown) => {
      creds = undefined;
      throw err;
    }));
  return async (presence, request) => {
    let c = await credentials();
    if (Date.parse(new X509Certificate(c.cert).validTo) < Date.now()) {
      creds = undefined;
      c = await credentials();
    }
    return dialDirect(presence, request, { ...base, ...c });
  };
}
