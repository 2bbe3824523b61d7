/**
 * The pass-through route of end-to-end streams, at the Proxy (the contract: src/tunnel/e2e.ts; the prose:
 * docs/tunnels.md, "End-to-end streams: the Proxy"). The route gateway-e2e takes a connection whose first bytes
 * are `GWE2E1 ` (the multiplexer sniffed them); nothing of it is terminated here. Then:
 *
 *   1. the stream line, `GWE2E1 <grant token>\n`, read incrementally (parseE2ELine: at most E2E_LINE_MAX_BYTES,
 *      within E2E_LINE_TIMEOUT_MS); what follows it is the client's TLS with the agent, kept for the agent;
 *   2. the grant, checked by this Proxy whether or not it issued it (e2eissuer.ts: its issuer certificate chains to
 *      the host CA and is a live Proxy's, its signature, not expired), for an agent of this cluster, and not
 *      routed by this Proxy before (`routed`: kept until its exp, at most ROUTED_GRANTS_MAX; beyond, refused
 *      rather than forgotten). Each Proxy takes a grant once; across Proxies the agent does (it keeps every id
 *      it served until its exp). A bad line, a bad or used grant: the TLS alert access_denied (the client waits
 *      for TLS: an alert record is what it reads), the close, GW_ERR_E2E_GRANT logged at most once per
 *      E2E_LOG_GAP_MS;
 *   3. the user the grant names, as it stands now (auth.resolveCaller: a lock or a removal since the grant was
 *      signed refuses it, access_denied); the stream is tracked in auth.sessions under the grant's identity from
 *      here on (a lock or a removal closes it, as for the classic routes), and the agent is told the same;
 *   4. the agent's current tunnel here (by host ID: it may have reconnected since the grant) and an idle data
 *      connection of it (e2edata.ts take); none idle and the agent takes streams on its tunnel (hello e2e.stream):
 *      a new stream of that tunnel, at once (carrierOf); otherwise one within DATA_WAIT_MS, else the TLS alert
 *      internal_error;
 *   5. the E2EOpenMessage naming the data connection, the grant and the client's addresses, on the tunnel's
 *      control stream (or as the tunnel stream's first line, conn E2E_CONN_TUNNEL); then the ClientHello and
 *      everything after it are spliced both ways (src/stream/splice.ts: a break is a reset). The Proxy holds no
 *      key of the stream: it relays TLS records between client and agent;
 *   6. audit: the route it authorized and the bytes it relayed, as db/app/desktop/kube session events with e2e: true
 *      (no db_user or db_name: it cannot see them); SSH sessions are the agent's to audit, as on the classic route.
 *
 * e2eServices() wires the three routes (grant, e2e, data) for the Proxy role.
 */
import { createPrivateKey, X509Certificate } from 'node:crypto';
import type { Duplex } from 'node:stream';
import type { Identity } from '../auth/pki.js';
import type { ProxyAuth } from '../auth/proxyauth.js';
import { toGatewayError } from '../errors.js';
import { logger, type Logger } from '../log.js';
import { e2eByteCounters, recordE2EStream, type StreamOutcome } from '../metrics/e2e.js';
import { clientOf, fatalTlsAlert, type ConnInfo } from '../mux/multiplexer.js';
import { writeJsonLine } from '../stream/lines.js';
import { splice } from '../stream/splice.js';
import { DATA_WAIT_MS, E2E_CONN_TUNNEL, E2E_LINE_TIMEOUT_MS, e2eLine, parseE2ELine, type E2EGrant, type E2EOpenMessage, type GrantCheck } from '../tunnel/e2e.js';
import type { DataConnections, DataTunnel } from './e2edata.js';
import { createGrantHandler, type GrantContext } from './e2egrants.js';
import { GrantIssuers } from './e2eissuer.js';
import type { AgentSource, E2EPeer, Router } from './router.js';
import type { SessionAudit, SessionKind } from './sessionaudit.js';
import type { TunnelServer } from './tunnel.js';

/** Fatal TLS alerts: access_denied (49) and internal_error (80). */
export const ACCESS_DENIED_ALERT = fatalTlsAlert(49);
export const INTERNAL_ERROR_ALERT = fatalTlsAlert(80);
/** How long a refused stream may take to read its alert before it is dropped. */
const ALERT_LINGER_MS = 2_000;
/** A refusal of each kind is logged at most once per this long. */
export const E2E_LOG_GAP_MS = 10_000;
/** How long the Proxy may take to reach a peer's peering listener with a stream it relays there (Proxy peering). */
export const E2E_FORWARD_DIAL_MS = 10_000;
/** Grant ids a Proxy remembers as routed (each until its exp); a grant beyond this many unexpired ones is refused. */
export const ROUTED_GRANTS_MAX = 100_000;

export interface RelayContext {
  auth: Pick<ProxyAuth, 'sessions' | 'resolveCaller' | 'clusterName'>;
  /** Checks a grant's issuer and signature (e2eissuer.ts GrantIssuers). */
  issuers: { check(token: string, now: number): GrantCheck };
  data: DataConnections;
  audit?: SessionAudit;
  /** Tells the agent when the stream's user is locked or removed (TunnelServer.trackE2E): it closes its end too. */
  tellAgent?: Pick<TunnelServer, 'trackE2E'>;
  /**
   * Relaying to a peer that holds the agent's tunnel (Proxy peering) when this Proxy holds none: the peers
   * (router.ts e2ePeers) and the Dialer that reaches their peering address. Without it, such a stream is refused.
   */
  forward?: { peers(hostId: string): readonly Pick<E2EPeer, 'proxyId' | 'peerAddr'>[]; dial(addr: string): Promise<Duplex> };
  dataWaitMs?: number;
  lineTimeoutMs?: number;
  routedMax?: number;
  now?: () => number;
  log?: Logger;
}

/** The audit kind of a grant's service; SSH (node) sessions are the agent's (as access.ts). */
const AUDIT_KIND: Partial<Record<E2EGrant['service'], SessionKind>> = { db: 'db', app: 'app', desktop: 'desktop', kube: 'kube' };

/** Grant ids this Proxy routed, until their exp: each is routed once here. */
export class RoutedGrants {
  private readonly ids = new Map<string, number>();
  constructor(private readonly max: number) {}

  /** Marks the grant routed; why not, when it was before or too many are held. */
  take(g: E2EGrant, now: number): string | undefined {
    for (const [id, exp] of this.ids) {
      if (exp > now) break; // in the order taken, all equally long-lived (GRANT_TTL_MS): the first unexpired ends the sweep
      this.ids.delete(id);
    }
    if (this.ids.has(g.id)) return 'the grant was routed by this Proxy before (a grant opens one stream)';
    if (this.ids.size >= this.max) return `this Proxy holds ${this.max} routed grants not yet expired, its most`;
    this.ids.set(g.id, g.exp);
    return undefined;
  }
}

/**
 * The route gateway-e2e's service; `peered` serves the streams a peer relayed to this Proxy's peering listener
 * (peer.ts): the same checks, but never forwarded again (no loops).
 */
export type E2ERelay = ((stream: Duplex, info: ConnInfo) => void) & { peered: (stream: Duplex, info: ConnInfo) => void };

export function createE2ERelay(options: RelayContext): E2ERelay {
  const log = options.log ?? logger('e2e-relay');
  const ctx: RelayContext = { ...options, log };
  const routed = new RoutedGrants(options.routedMax ?? ROUTED_GRANTS_MAX);
  const logged = new Map<StreamOutcome, number>();
  const refuse = (stream: Duplex, info: ConnInfo, outcome: StreamOutcome, alert: Buffer, why: string, code?: string) => {
    recordE2EStream(outcome);
    sendAlert(stream, alert);
    const now = Date.now();
    if ((logged.get(outcome) ?? -Infinity) > now - E2E_LOG_GAP_MS) return;
    logged.set(outcome, now);
    const logCode = code ?? (outcome === 'grant' ? 'GW_ERR_E2E_GRANT' : 'GW_ERR_TUNNEL_NOT_FOUND');
    log.info({ code: logCode, client: clientOf(info), why }, 'end-to-end stream refused (logged once per 10 s per reason)');
  };
  const serve = (stream: Duplex, info: ConnInfo, peered: boolean) => {
    stream.on('error', () => stream.destroy());
    readLine(stream, ctx.lineTimeoutMs ?? E2E_LINE_TIMEOUT_MS, (read) => {
      if (!read.ok) return refuse(stream, info, 'grant', ACCESS_DENIED_ALERT, read.why);
      const now = (ctx.now ?? Date.now)();
      const checked = ctx.issuers.check(read.token, now);
      if (!checked.ok) return refuse(stream, info, 'grant', ACCESS_DENIED_ALERT, checked.why);
      const g = checked.grant;
      const used = routed.take(g, now);
      if (used) return refuse(stream, info, 'grant', ACCESS_DENIED_ALERT, used);
      const identity: Identity = { kind: 'user', name: g.sub, cluster: ctx.auth.clusterName, roles: [...g.roles] };
      void admit(ctx, stream, info, identity, g, read.token, peered).then((refusal) => {
        if (refusal) refuse(stream, info, refusal.outcome, refusal.alert, refusal.why, refusal.code);
      });
    });
  };
  return Object.assign((stream: Duplex, info: ConnInfo) => serve(stream, info, false), { peered: (stream: Duplex, info: ConnInfo) => serve(stream, info, true) });
}

type LineRead = { ok: true; token: string } | { ok: false; why: string };

/** Step 1: the stream line within its deadline; the bytes after it are put back for the agent. */
function readLine(stream: Duplex, timeoutMs: number, done: (read: LineRead) => void): void {
  let buf = Buffer.alloc(0);
  let finished = false;
  const finish = (read: LineRead, rest?: Buffer) => {
    if (finished) return;
    finished = true;
    clearTimeout(timer);
    stream.off('data', onData);
    stream.off('close', onClose);
    stream.pause();
    // Put back only once this reader is off the stream (unshift may emit at once).
    if (rest && rest.length > 0) stream.unshift(rest);
    done(read);
  };
  const timer = setTimeout(() => finish({ ok: false, why: `no whole stream line within ${timeoutMs} ms` }), timeoutMs);
  const onClose = () => finish({ ok: false, why: 'the client closed before its stream line ended' });
  const onData = (chunk: Buffer) => {
    // The whole chunk is kept (its tail is the ClientHello): at most E2E_LINE_MAX_BYTES and one chunk (the parser
    // says bad past the cap).
    buf = Buffer.concat([buf, chunk]);
    const parsed = parseE2ELine(buf);
    if (parsed.kind === 'need-more') return;
    if (parsed.kind === 'bad') return finish({ ok: false, why: parsed.why });
    // The line is only ever followed by TLS: at most a ClientHello (the client waits for the agent's answer).
    finish({ ok: true, token: parsed.token }, buf.subarray(parsed.length));
  };
  stream.on('data', onData);
  stream.once('close', onClose);
}

interface Refusal {
  outcome: StreamOutcome;
  alert: Buffer;
  why: string;
  code?: string;
}

/** Step 3 on: the user as it stands, tracking, then the route; a refusal when it did not open. */
async function admit(ctx: RelayContext, stream: Duplex, info: ConnInfo, identity: Identity, g: E2EGrant, token: string, peered: boolean): Promise<Refusal | undefined> {
  const log = ctx.log!;
  let revoked: string | undefined;
  // Tracked before the check: a lock that lands while it runs still closes the stream.
  const untrack = ctx.auth.sessions.track(identity, `gateway-e2e ${clientOf(info)}`, (why) => {
    log.info({ user: g.sub, client: clientOf(info), code: why.code }, 'end-to-end stream closed: identity revoked');
    revoked = `identity revoked: ${why.code}`;
    stream.destroy();
  });
  stream.once('close', untrack);
  try {
    await ctx.auth.resolveCaller(identity);
  } catch (err) {
    untrack();
    const e = toGatewayError(err);
    return { outcome: 'revoked', alert: ACCESS_DENIED_ALERT, why: `user ${g.sub}: ${e.message}`, code: e.code };
  }
  if (stream.destroyed) {
    untrack();
    return undefined;
  }
  // The agent closes its end of a revoked user's streams too, and refuses the user's grants for a while.
  const untrackAgent = ctx.tellAgent?.trackE2E(g.agent, identity, stream);
  if (untrackAgent) stream.once('close', untrackAgent);
  const local = ctx.data.tunnelOf(g.agent);
  const outcome = local || peered || !ctx.forward ? await route(ctx, stream, info, g, token, () => revoked) : await forward(ctx, stream, info, g, token);
  if (outcome === 'opened' || outcome === 'forwarded') return undefined;
  untrack();
  untrackAgent?.();
  const why = outcome === 'no-data' ? 'no idle data connection in time' : peered ? 'no tunnel to this Proxy now (a stream relayed by a peer is never relayed again)' : ctx.forward ? 'no tunnel to this Proxy now, and no peer that holds one took the stream' : 'no tunnel to this Proxy now';
  return { outcome, alert: INTERNAL_ERROR_ALERT, why: `agent ${g.agent}: ${why}` };
}

/**
 * No tunnel of the agent here: the stream goes to a peer that holds one, raw (the stream is end-to-end TLS
 * already: no second layer), to its peering listener, which sniffs the stream line and routes it as this route
 * does, never further. The stream line again, then the client's bytes as they come (its ClientHello was put back).
 * The first peer that takes the connection carries it; the peer checks the grant itself and records the session.
 */
async function forward(ctx: RelayContext, stream: Duplex, info: ConnInfo, g: E2EGrant, token: string): Promise<StreamOutcome> {
  const log = ctx.log!;
  for (const peer of ctx.forward!.peers(g.agent)) {
    let socket: Duplex;
    try {
      socket = await ctx.forward!.dial(peer.peerAddr);
    } catch (err) {
      log.info({ agent: g.agent, peer: peer.proxyId, peerAddr: peer.peerAddr, err: (err as Error).message }, 'cannot reach a peer for an end-to-end stream; trying the next');
      continue;
    }
    if (stream.destroyed) {
      socket.destroy();
      return 'forwarded';
    }
    socket.on('error', () => socket.destroy());
    socket.write(e2eLine(token));
    recordE2EStream('forwarded');
    log.info({ user: g.sub, resource: g.resource, agent: g.agent, peer: peer.proxyId, client: clientOf(info), grant: g.id, issuer: g.iss }, 'end-to-end stream forwarded');
    const counters = e2eByteCounters();
    stream.on('data', (chunk: Buffer) => counters.in.inc(chunk.length));
    socket.on('data', (chunk: Buffer) => counters.out.inc(chunk.length));
    splice(stream, socket);
    return 'forwarded';
  }
  return 'no-tunnel';
}

/** Steps 4 to 6; the outcome when it did not open. */
async function route(ctx: RelayContext, stream: Duplex, info: ConnInfo, g: E2EGrant, token: string, revoked: () => string | undefined): Promise<StreamOutcome> {
  const tunnel = ctx.data.tunnelOf(g.agent);
  if (!tunnel) return 'no-tunnel';
  const carrier = await carrierOf(ctx, tunnel);
  if (carrier === 'no-tunnel' || carrier === 'no-data') return carrier;
  const conn = carrier.conn;
  if (stream.destroyed) {
    // The client left (or was revoked) while the Proxy waited: the carrier carries nothing of it.
    conn.stream.destroy();
    return 'opened';
  }
  const trace = { ...(g.traceparent ? { traceparent: g.traceparent } : {}), ...(g.tracestate ? { tracestate: g.tracestate } : {}) };
  const open: E2EOpenMessage = { type: 'e2e-open', conn: conn.n, grant: token, client_src: clientOf(info), client_dst: `${info.localAddress}:${info.localPort}`, ...trace };
  // On a data connection the control stream names it; on a tunnel stream the line is that stream's first.
  if (carrier.via === 'data') tunnel.send(open);
  else writeJsonLine(conn.stream, open);
  recordE2EStream(carrier.via === 'data' ? 'opened' : 'tunnel-stream');
  ctx.log?.info({ user: g.sub, resource: g.resource, agent: tunnel.nodename, client: clientOf(info), grant: g.id, issuer: g.iss, via: carrier.via }, 'end-to-end stream routed');
  const counters = e2eByteCounters();
  stream.on('data', (chunk: Buffer) => counters.in.inc(chunk.length));
  conn.stream.on('data', (chunk: Buffer) => counters.out.inc(chunk.length));
  const kind = AUDIT_KIND[g.service];
  if (ctx.audit && kind) {
    const session = ctx.audit.start(kind, { user: g.sub, resource: g.resource, node: tunnel.nodename, client: clientOf(info), e2e: true });
    ctx.audit.spliced(session, stream, conn.stream, revoked);
  }
  splice(stream, conn.stream);
  return 'opened';
}

/**
 * What carries the stream to the agent: an idle data connection of its tunnel here; none waiting and the agent takes
 * streams on its tunnel (its hello's e2e.stream): a stream of that tunnel, at once (a data connection is faster, but
 * one may be long in coming: a Proxy that just joined, a balancer that sends them all elsewhere); otherwise a data
 * connection within the wait.
 */
async function carrierOf(ctx: RelayContext, tunnel: DataTunnel): Promise<{ via: 'data' | 'tunnel'; conn: { n: number; stream: Duplex } } | 'no-data' | 'no-tunnel'> {
  const conn = await ctx.data.take(tunnel, tunnel.tunnelStreams ? 0 : (ctx.dataWaitMs ?? DATA_WAIT_MS));
  if (conn) return { via: 'data', conn };
  if (!tunnel.tunnelStreams) return 'no-data';
  try {
    return { via: 'tunnel', conn: { n: E2E_CONN_TUNNEL, stream: await tunnel.openStream() } };
  } catch (err) {
    ctx.log?.info({ agent: tunnel.nodename, err: (err as Error).message }, 'cannot open a stream on the agent\'s tunnel for an end-to-end stream');
    return 'no-tunnel';
  }
}

function sendAlert(stream: Duplex, alert: Buffer): void {
  if (stream.destroyed) return;
  stream.end(alert);
  stream.resume(); // what else the client sent is read and dropped, so that the close is a FIN, not a reset
  setTimeout(() => stream.destroy(), ALERT_LINGER_MS).unref();
}

/** What the Proxy role plugs into the front door for the three routes of end-to-end streams. */
export interface E2EWiring {
  auth: ProxyAuth;
  agents: AgentSource;
  tunnels: TunnelServer;
  /** This Proxy's TLS key and certificate (PEM: what its tunnels are served with), unless that is the operator's, and host ID. */
  tls: { key: string; cert: string } | undefined;
  proxyId: string;
  /** The cluster's live Proxies (ClusterView): a grant's issuer must be one. */
  cluster: { proxy(id: string): unknown };
  audit?: SessionAudit;
  /** Proxy peering: the peers that hold an agent's tunnel, and the Dialer to their peering listeners. */
  peering?: { router: Pick<Router, 'e2ePeers'>; dial(addr: string): Promise<Duplex> };
}

export function e2eServices(w: E2EWiring): { grant: (stream: Duplex, info: ConnInfo) => void; e2e: E2ERelay; data: (stream: Duplex, info: ConnInfo) => void } {
  const signer = w.tls ? { key: createPrivateKey(w.tls.key), x5c: new X509Certificate(w.tls.cert).raw.toString('base64url'), iss: w.proxyId } : undefined;
  const peering = w.peering;
  const grants: GrantContext = { auth: w.auth, agents: w.agents, tunnels: w.tunnels, data: w.tunnels.data, ...(signer ? { signer } : {}), ...(peering ? { peering: peering.router } : {}) };
  const forward = peering ? { forward: { peers: (hostId: string) => peering.router.e2ePeers(hostId).peers, dial: (addr: string) => peering.dial(addr) } } : {};
  const issuers = new GrantIssuers({ trust: w.auth, live: (id) => w.cluster.proxy(id) !== undefined });
  return {
    grant: createGrantHandler(grants),
    e2e: createE2ERelay({ auth: w.auth, issuers, data: w.tunnels.data, tellAgent: w.tunnels, ...forward, ...(w.audit ? { audit: w.audit } : {}) }),
    data: w.tunnels.data.handle,
  };
}
