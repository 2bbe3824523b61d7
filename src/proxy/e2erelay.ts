/**
 * The pass-through route of end-to-end streams, at the Proxy (the contract: src/tunnel/e2e.ts; the prose:
 * docs/tunnels.md, "End-to-end streams: the Proxy"). The route gateway-e2e is NOT terminated: the multiplexer parsed
 * the ClientHello (its server name is in ConnInfo.serverName) and pushed it back onto the stream. Then:
 *
 *   1. the grant: grantIdOfServerName(server name) taken from the GrantStore (e2egrants.ts): single use (taken
 *      out), not expired. None (unknown, used, expired, a server name that is no grant): the TLS alert
 *      access_denied, the close, GW_ERR_E2E_GRANT logged at most once per E2E_LOG_GAP_MS;
 *   2. the stream is tracked in auth.sessions under the grant's user from here on (a lock or a removal closes it
 *      at the Proxy, as for the classic routes);
 *   3. the agent's current tunnel here (by host ID: it may have reconnected since the grant) and an idle data
 *      connection of it (e2edata.ts take, waiting up to DATA_WAIT_MS); none: the TLS alert internal_error;
 *   4. the E2EOpenMessage on the tunnel's control stream, naming the data connection, the grant and the client's
 *      addresses; then the buffered ClientHello and everything after it are spliced both ways (src/stream/splice.ts:
 *      a break is a reset). The Proxy holds no key of the stream: it relays TLS records between client and agent;
 *   5. audit: the route it authorized and the bytes it relayed, as db/app/desktop/kube session events with e2e: true
 *      (no db_user or db_name: it cannot see them); SSH sessions are the agent's to audit, as on the classic route.
 *
 * e2eServices() wires the three routes (grant, e2e, data) for the Proxy role.
 */
import { createPrivateKey } from 'node:crypto';
import type { Duplex } from 'node:stream';
import type { ProxyAuth } from '../auth/proxyauth.js';
import { logger, type Logger } from '../log.js';
import { e2eByteCounters, recordE2EStream, type StreamOutcome } from '../metrics/e2e.js';
import { clientOf, fatalTlsAlert, type ConnInfo } from '../mux/multiplexer.js';
import { splice } from '../stream/splice.js';
import { DATA_WAIT_MS, grantIdOfServerName, type E2EOpenMessage } from '../tunnel/e2e.js';
import type { DataConnections } from './e2edata.js';
import { createGrantHandler, GrantStore, type GrantContext, type HeldGrant } from './e2egrants.js';
import type { AgentSource } from './router.js';
import type { SessionAudit, SessionKind } from './sessionaudit.js';
import type { TunnelServer } from './tunnel.js';

/** Fatal TLS alerts: access_denied (49) and internal_error (80). */
export const ACCESS_DENIED_ALERT = fatalTlsAlert(49);
export const INTERNAL_ERROR_ALERT = fatalTlsAlert(80);
/** How long a refused stream may take to read its alert before it is dropped. */
const ALERT_LINGER_MS = 2_000;
/** A refusal of each kind is logged at most once per this long. */
export const E2E_LOG_GAP_MS = 10_000;

export interface RelayContext {
  auth: Pick<ProxyAuth, 'sessions'>;
  store: GrantStore;
  data: DataConnections;
  audit?: SessionAudit;
  /** Tells the agent when the stream's user is locked or removed (TunnelServer.trackE2E): it closes its end too. */
  tellAgent?: Pick<TunnelServer, 'trackE2E'>;
  dataWaitMs?: number;
  now?: () => number;
  log?: Logger;
}

/** The audit kind of a target's sessions; SSH (node) sessions are the agent's (as access.ts). */
const AUDIT_KIND: Record<string, SessionKind> = { db: 'db', app: 'app', windows_desktop: 'desktop', kube_cluster: 'kube' };

/** The route gateway-e2e's service. */
export function createE2ERelay(options: RelayContext): (stream: Duplex, info: ConnInfo) => void {
  const log = options.log ?? logger('e2e-relay');
  const ctx: RelayContext = { ...options, log };
  const logged = new Map<StreamOutcome, number>();
  const refuse = (stream: Duplex, info: ConnInfo, outcome: StreamOutcome, alert: Buffer, why: string) => {
    recordE2EStream(outcome);
    sendAlert(stream, alert);
    const now = Date.now();
    if ((logged.get(outcome) ?? -Infinity) > now - E2E_LOG_GAP_MS) return;
    logged.set(outcome, now);
    const code = outcome === 'grant' ? 'GW_ERR_E2E_GRANT' : 'GW_ERR_TUNNEL_NOT_FOUND';
    log.info({ code, client: clientOf(info), server_name: info.serverName?.slice(0, 80), why }, 'end-to-end stream refused (logged once per 10 s per reason)');
  };
  return (stream, info) => {
    stream.on('error', () => stream.destroy());
    const held = ctx.store.take(grantIdOfServerName(info.serverName), (ctx.now ?? Date.now)());
    if (!held) return refuse(stream, info, 'grant', ACCESS_DENIED_ALERT, 'the server name names no grant this Proxy holds (unknown, used or expired)');
    let revoked: string | undefined;
    const untrack = ctx.auth.sessions.track(held.identity, `gateway-e2e ${clientOf(info)}`, (why) => {
      log.info({ user: held.grant.sub, client: clientOf(info), code: why.code }, 'end-to-end stream closed: identity revoked');
      revoked = `identity revoked: ${why.code}`;
      stream.destroy();
    });
    stream.once('close', untrack);
    // The agent closes its end of a revoked user's streams too, and refuses the user's grants for a while.
    const untrackAgent = ctx.tellAgent?.trackE2E(held.grant.agent, held.identity, stream);
    if (untrackAgent) stream.once('close', untrackAgent);
    void route(ctx, stream, info, held, () => revoked).then((outcome) => {
      if (outcome === 'opened') return;
      untrack();
      untrackAgent?.();
      refuse(stream, info, outcome, INTERNAL_ERROR_ALERT, `agent ${held.grant.agent}: ${outcome === 'no-tunnel' ? 'no tunnel to this Proxy now' : 'no idle data connection in time'}`);
    });
  };
}

/** Steps 3 to 5; the outcome when it did not open. */
async function route(ctx: RelayContext, stream: Duplex, info: ConnInfo, held: HeldGrant, revoked: () => string | undefined): Promise<StreamOutcome> {
  const tunnel = ctx.data.tunnelOf(held.grant.agent);
  if (!tunnel) return 'no-tunnel';
  const conn = await ctx.data.take(tunnel, ctx.dataWaitMs ?? DATA_WAIT_MS);
  if (!conn) return 'no-data';
  if (stream.destroyed) {
    // The client left (or was revoked) while the Proxy waited: the data connection carries nothing of it.
    conn.stream.destroy();
    return 'opened';
  }
  const open: E2EOpenMessage = { type: 'e2e-open', conn: conn.n, grant: held.token, client_src: clientOf(info), client_dst: `${info.localAddress}:${info.localPort}`, ...held.trace };
  tunnel.send(open);
  recordE2EStream('opened');
  ctx.log?.info({ user: held.grant.sub, resource: held.grant.resource, agent: held.nodename, client: clientOf(info), grant: held.grant.id }, 'end-to-end stream routed');
  const counters = e2eByteCounters();
  stream.on('data', (chunk: Buffer) => counters.in.inc(chunk.length));
  conn.stream.on('data', (chunk: Buffer) => counters.out.inc(chunk.length));
  const kind = AUDIT_KIND[held.access];
  if (ctx.audit && kind) {
    const session = ctx.audit.start(kind, { user: held.grant.sub, resource: held.grant.resource, node: held.nodename, client: clientOf(info), e2e: true });
    ctx.audit.spliced(session, stream, conn.stream, revoked);
  }
  splice(stream, conn.stream);
  return 'opened';
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
  /** This Proxy's TLS private key (PEM: the certificate its tunnels are served with), unless that is the operator's, and host ID. */
  tlsKey: string | undefined;
  proxyId: string;
  audit?: SessionAudit;
}

export function e2eServices(w: E2EWiring): { grant: (stream: Duplex, info: ConnInfo) => void; e2e: (stream: Duplex, info: ConnInfo) => void; data: (stream: Duplex, info: ConnInfo) => void } {
  const store = new GrantStore();
  const grants: GrantContext = { auth: w.auth, agents: w.agents, tunnels: w.tunnels, data: w.tunnels.data, ...(w.tlsKey ? { signer: { key: createPrivateKey(w.tlsKey), iss: w.proxyId } } : {}), store };
  return {
    grant: createGrantHandler(grants),
    e2e: createE2ERelay({ auth: w.auth, store, data: w.tunnels.data, tellAgent: w.tunnels, ...(w.audit ? { audit: w.audit } : {}) }),
    data: w.tunnels.data.handle,
  };
}
