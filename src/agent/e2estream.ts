/**
 * The agent's end of end-to-end streams (one E2EStreams for all the tunnels of an agent: a grant used on one is used) (src/tunnel/e2e.ts is the contract; docs/tunnels.md "End-to-end streams: the
 * agent" the prose): an e2e-open on a v2 tunnel's control stream assigns one of the tunnel's idle data connections
 * (src/agent/e2edata.ts) to a client's TLS, which the agent terminates itself. It decides, in this order, and the
 * first check that fails is the refusal's message:
 *
 *   grant     verifyGrant against the certificate of the Proxy that issued it, grant.iss: any Proxy this agent holds
 *             a tunnel to (registerProxy: the certificate its tunnel's TLS verified), not only the one whose tunnel
 *             the e2e-open came on (behind a load balancer the grant session and the stream reach different
 *             Proxies); no tunnel to grant.iss (Proxy peering: the agent holds tunnels to some Proxies only):
 *             the grant's own issuer certificate (x5c), checked as any Proxy checks it (src/auth/grantissuer.ts:
 *             the host CA, valid now, a host of this cluster with role proxy named grant.iss; the agent cannot
 *             tell whether that Proxy is live: the Proxy that routed the stream did). Its signature, not expired,
 *             not issued in the future;
 *             grant.agent this agent's; the
 *             resource is one this agent serves for grant.service; the id was not used before (kept until exp,
 *             at most GRANTS_SEEN_MAX: beyond, refused rather than forgotten): each Proxy routes a grant once,
 *             and this makes it once across Proxies; the user is not locked here
 *   TLS       TLS 1.3 with the host certificate, the cluster's user CA as the only client CA, ALPN E2E_ALPN, within
 *             E2E_HANDSHAKE_TIMEOUT_MS; a handshake that fails or times out is closed (nothing to answer on)
 *   user      the client certificate verified against the user CA, a user identity of this cluster named
 *             grant.sub, its public key's spkiHash equal to grant.key, its roles including every grant.roles entry
 *
 * A refusal is one DialAnswer line inside the TLS, {"ok":false,"error":{"code":"GW_ERR_E2E_REFUSED",...}}, and the
 * end: the client prints a code, never a reset. A stream that passes is served by the code that serves tunnel
 * streams (src/agent/tunnel.ts serveDial), which writes the DialAnswer itself, with the DialRequest the grant
 * implies. Locks: the Proxy names, on the control stream (`locks`), the users it found revoked while they had an
 * end-to-end stream here; their open streams are closed, and for LOCKED_USER_HOLD_MS (past it, any grant issued
 * before the lock has expired) their grants issued until the Proxy's `at` are refused: one issued after it was
 * signed by a Proxy that checked the locks again, so an unlock takes effect at once. Audit: the
 * start and end of each app, database, desktop and Kubernetes stream are reported as the tunnel reports events,
 * with e2e: true and the grant id; SSH sessions are the SSH Service's to report.
 */
import { X509Certificate } from 'node:crypto';
import type net from 'node:net';
import type { Duplex } from 'node:stream';
import tls, { type SecureContext, type TLSSocket } from 'node:tls';
import { checkGrantIssuer } from '../auth/grantissuer.js';
import { identityFromCert, type Identity } from '../auth/pki.js';
import { GatewayError } from '../errors.js';
import type { Logger } from '../log.js';
import { recordClientVerification, serverSecureContext } from '../net/tls.js';
import { writeJsonLine } from '../stream/lines.js';
import { badE2EOpen, decodeGrant, E2E_ALPN, GRANT_TTL_MS, GRANT_CLOCK_SKEW_MS, spkiHash, verifyGrant, type E2EGrant } from '../tunnel/e2e.js';
import type { AgentResources, DialAnswer, DialRequest, E2EOpenMessage, LocksMessage, ServiceKind } from '../tunnel/protocol.js';
import type { HostIdentity } from './identity.js';

/** The client's TLS handshake on a data connection must complete within this. */
export const E2E_HANDSHAKE_TIMEOUT_MS = 10_000;
/** Grant ids remembered as used (each until its exp); a grant beyond this many unexpired ones is refused. */
export const GRANTS_SEEN_MAX = 100_000;
/** How long a user the Proxy named in `locks` is refused here: any grant signed before the lock has expired by then. */
export const LOCKED_USER_HOLD_MS = GRANT_TTL_MS + GRANT_CLOCK_SKEW_MS;
/** Users remembered as locked at once (the oldest is forgotten beyond: the Proxy still refuses them). */
export const LOCKED_USERS_MAX = 10_000;

/** Serves a stream that passed the checks as a tunnel stream (src/agent/tunnel.ts); onOpen once the session runs. */
export type StreamServer = (channel: Duplex, request: DialRequest, onOpen: (fields: Record<string, unknown>) => void) => void;

export interface E2EStreamsOptions {
  identity: HostIdentity;
  services: readonly ServiceKind[];
  resources: AgentResources;
  /** Whether the agent runs an SSH Service (ssh grants are for it). */
  ssh: boolean;
  log: Logger;
  handshakeTimeoutMs?: number;
  /** The clock (tests). */
  now?: () => number;
}

/** The tunnel an e2e-open came on: its Proxy as this agent verified it, and its data connections. */
export interface E2ETunnel {
  /** The host ID of the Proxy's certificate. */
  proxyId: string;
  /** That certificate (the grant's signer). */
  proxyCert: X509Certificate;
  /** Data connection n if it waits at this tunnel's Proxy; a promise while the Proxy's answer to it is awaited. */
  take(n: number): Duplex | undefined | Promise<Duplex | undefined>;
  /** Registers a stream with the tunnel (its drain waits for it; the tunnel's close closes it). */
  track(stream: Duplex): void;
  /** The tunnel's serving of a stream (src/agent/tunnel.ts serveDial). */
  serve: StreamServer;
  /** The tunnel's audit events (queued while it is down). */
  sendEvent(event: Record<string, unknown>): void;
}

interface OpenStream {
  user: string;
  socket: Duplex;
}

/** Why a check refused, as the DialAnswer's message. */
class Refusal extends Error {}

/**
 * A check's refusal, or anything else a hostile input made a check throw (a certificate no parser takes): refused
 * too, never an exception out of a control message or a TLS event.
 */
function whyOf(err: unknown): string {
  return err instanceof Refusal ? err.message : `a check failed: ${(err as Error)?.message ?? String(err)}`;
}

export class E2EStreams {
  /** Grant id → its exp: single use. */
  private readonly seen = new Map<string, number>();
  /** User → until when it is refused here. */
  /** Locked users: until when (this agent's clock) and the Proxy's time of the lock (grants' iat clock), if it said. */
  private readonly locked = new Map<string, { until: number; at: number | undefined }>();
  private readonly open = new Set<OpenStream>();
  /** Proxy host ID → the certificates of this agent's tunnels to it (each as its tunnel's TLS verified it). */
  private readonly proxies = new Map<string, X509Certificate[]>();
  private context: { cert: string; ctx: SecureContext } | undefined;
  private readonly now: () => number;

  constructor(private readonly options: E2EStreamsOptions) {
    this.now = options.now ?? Date.now;
  }

  /** The end-to-end streams open now. */
  get count(): number {
    return this.open.size;
  }

  /**
   * A tunnel to Proxy `proxyId` is up, whose TLS presented `cert`: grants that Proxy issued are checked with it,
   * whichever tunnel their e2e-open comes on. The returned function forgets it (the tunnel closed).
   */
  registerProxy(proxyId: string, cert: X509Certificate): () => void {
    const list = this.proxies.get(proxyId) ?? [];
    list.push(cert);
    this.proxies.set(proxyId, list);
    let done = false;
    return () => {
      if (done) return;
      done = true;
      const now = this.proxies.get(proxyId);
      const i = now?.indexOf(cert) ?? -1;
      if (i >= 0) now!.splice(i, 1);
      if (now && now.length === 0) this.proxies.delete(proxyId);
    };
  }

  /** An e2e-open from the Proxy of `tunnel`: unknown data connection numbers are logged and ignored. */
  onOpen(m: E2EOpenMessage, tunnel: E2ETunnel): void {
    const bad = badE2EOpen(m as unknown as Record<string, unknown>);
    if (bad) return void this.options.log.warn({ why: bad }, 'ignoring a malformed e2e-open');
    const taken = tunnel.take(m.conn);
    if (taken instanceof Promise) void taken.then((socket) => this.opened(m, tunnel, socket));
    else this.opened(m, tunnel, taken);
  }

  /**
   * An e2e-open that is the first line of a stream of `tunnel` (conn E2E_CONN_TUNNEL: no data connection waited at
   * its Proxy): that stream carries the client's TLS, checked and served exactly as on a data connection.
   */
  onTunnelStream(m: E2EOpenMessage, tunnel: E2ETunnel, channel: Duplex): void {
    const bad = badE2EOpen(m as unknown as Record<string, unknown>, 'tunnel-stream');
    if (bad) {
      this.options.log.warn({ why: bad }, 'closing a tunnel stream with a malformed e2e-open');
      return void channel.destroy();
    }
    this.opened(m, tunnel, channel);
  }

  /**
   * The data connection the e2e-open names, once the pool has it (the e2e-open may overtake the Proxy's answer on
   * the data connection: src/agent/e2edata.ts take).
   */
  private opened(m: E2EOpenMessage, tunnel: E2ETunnel, socket: Duplex | undefined): void {
    if (!socket) return void this.options.log.warn({ conn: m.conn, proxyId: tunnel.proxyId }, 'an e2e-open names a data connection this agent does not hold idle at that Proxy; ignored');
    tunnel.track(socket);
    let grant: E2EGrant | undefined;
    let refusal: string | undefined;
    try {
      grant = this.checkGrant(m.grant, tunnel);
    } catch (err) {
      refusal = whyOf(err);
    }
    try {
      this.handshake(socket, (tlsSocket) => this.decide(tlsSocket, m, tunnel, grant, refusal));
    } catch (err) {
      // No TLS to answer in (the host certificate or key unusable): the stream is closed, the tunnel kept.
      this.options.log.error({ err: (err as Error).message }, 'cannot start TLS for an end-to-end stream; closing it');
      socket.destroy();
    }
  }

  /** After the handshake: the refusal found before, or the user's checks; then served or refused. */
  private decide(tlsSocket: TLSSocket, m: E2EOpenMessage, tunnel: E2ETunnel, grant: E2EGrant | undefined, refusal: string | undefined): void {
    try {
      if (refusal !== undefined) throw new Refusal(refusal);
      this.checkUser(tlsSocket, grant!);
      if (this.isLocked(grant!.sub, grant!.iat)) throw new Refusal(`user "${grant!.sub}" is locked (the Proxy said so on this tunnel)`);
    } catch (err) {
      return this.refuse(tlsSocket, whyOf(err), m, grant);
    }
    this.serve(tlsSocket, m, grant!, tunnel);
  }

  /** The Proxy found these users revoked: their open streams close, their grants are refused for LOCKED_USER_HOLD_MS. */
  onLocks(m: LocksMessage): void {
    const until = this.now() + LOCKED_USER_HOLD_MS;
    for (const user of m.users) {
      this.locked.delete(user);
      this.locked.set(user, { until, at: m.at });
      if (this.locked.size > LOCKED_USERS_MAX) this.locked.delete(this.locked.keys().next().value!);
    }
    const names = new Set(m.users);
    for (const s of [...this.open]) {
      if (!names.has(s.user)) continue;
      this.open.delete(s);
      this.options.log.info({ user: s.user, reason: m.reason }, 'end-to-end stream closed: the user is locked');
      s.socket.destroy();
    }
  }

  private isLocked(user: string, iat: number): boolean {
    const lock = this.locked.get(user);
    if (lock === undefined) return false;
    if (lock.until <= this.now()) {
      this.locked.delete(user);
      return false;
    }
    return lock.at === undefined || iat <= lock.at;
  }

  /** The grant's checks (see the file comment); marks it used. Throws Refusal. */
  private checkGrant(token: string, tunnel: E2ETunnel): E2EGrant {
    const now = this.now();
    const decoded = decodeGrant(token);
    if (!decoded.ok) throw new Refusal(decoded.why);
    const iss = decoded.grant.iss;
    // The tunnel the e2e-open came on counts even before its registration (a test's tunnel, a race at its start).
    const certs = [...(this.proxies.get(iss) ?? []), ...(iss === tunnel.proxyId ? [tunnel.proxyCert] : [])];
    if (certs.length === 0) {
      // No tunnel to the issuer (Proxy peering: the stream came through a Proxy that holds this agent's tunnel from
      // one that does not): its certificate is the grant's x5c, checked against the host CA as any Proxy checks it.
      const { identity } = this.options;
      const issuer = checkGrantIssuer(decoded.grant, identity.hostCa, identity.cluster, now);
      if (!issuer.ok) throw new Refusal(`the grant was issued by Proxy ${iss}, to which this agent holds no tunnel, and ${issuer.why} (routed by Proxy ${tunnel.proxyId})`);
      certs.push(issuer.cert);
    }
    let checked = verifyGrant(token, certs[0]!, now);
    for (const cert of certs.slice(1)) if (!checked.ok) checked = verifyGrant(token, cert, now);
    if (!checked.ok) throw new Refusal(checked.why);
    const g = checked.grant;
    if (g.agent !== this.options.identity.hostId) throw new Refusal(`the grant is for agent ${g.agent}, not this one (${this.options.identity.hostId})`);
    const why = this.notServed(g.service, g.resource);
    if (why) throw new Refusal(why);
    for (const [id, exp] of this.seen) {
      if (exp > now) break; // inserted in the order they were taken: the first unexpired ends the sweep, roughly
      this.seen.delete(id);
    }
    if (this.seen.has(g.id)) throw new Refusal('the grant was used before (a grant opens one stream)');
    if (this.seen.size >= GRANTS_SEEN_MAX) throw new Refusal('too many grants in flight on this agent; try again');
    this.seen.set(g.id, g.exp);
    return g;
  }

  /** Why this agent does not serve `resource` for `service`, or undefined. */
  private notServed(service: ServiceKind, resource: string): string | undefined {
    const r = this.options.resources;
    const names: Record<ServiceKind, () => boolean> = {
      ssh: () => this.options.ssh,
      db: () => r.databases.some((d) => d.name === resource),
      // Any app, as the classic gateway-tcp route serves it: bytes to its host and port (an HTTP app's are the client's HTTP).
      app: () => r.apps.some((a) => a.name === resource),
      desktop: () => r.desktops.some((d) => d.name === resource),
      kube: () => r.kube_clusters.some((k) => k.name === resource),
    };
    if (this.options.services.includes(service) && names[service]()) return undefined;
    return `this agent does not serve ${service} "${resource}" end to end`;
  }

  /** The user's certificate against the grant. Throws Refusal. */
  private checkUser(socket: TLSSocket, g: E2EGrant): void {
    const peer = socket.getPeerCertificate();
    if (!peer?.raw) throw new Refusal('no client certificate was presented');
    if (!socket.authorized) throw new Refusal(`the client certificate is not a user certificate of this cluster (${String(socket.authorizationError)})`);
    let who: Identity;
    try {
      who = identityFromCert(peer.raw);
    } catch (err) {
      throw new Refusal(`the client certificate carries no identity (${(err as Error).message})`);
    }
    if (who.kind !== 'user') throw new Refusal(`the client certificate is a ${who.kind} certificate, not a user's`);
    if (who.cluster !== this.options.identity.cluster) throw new Refusal(`the client certificate is for cluster "${who.cluster}"`);
    if (who.name !== g.sub) throw new Refusal(`the grant is for user "${g.sub}", the certificate names "${who.name}"`);
    if (spkiHash(peer.raw) !== g.key) throw new Refusal("the client certificate's key is not the one the grant is bound to");
    const missing = g.roles.filter((r) => !who.roles.includes(r));
    if (missing.length > 0) throw new Refusal(`the client certificate lacks the role(s) the grant was authorized with: ${missing.join(', ')}`);
  }

  /** TLS with the client on the data connection, the deadline included; onSecure once it is up. */
  private handshake(socket: Duplex, onSecure: (s: TLSSocket) => void): void {
    const { identity } = this.options;
    if (this.context?.cert !== identity.cert) {
      // Made again after a renewal replaced the host certificate.
      this.context = { cert: identity.cert, ctx: serverSecureContext({ key: identity.key, cert: identity.cert, ca: identity.userCa, minVersion: 'TLSv1.3' }, 'agent-e2e') };
    }
    const tlsSocket = new tls.TLSSocket(socket as net.Socket, { isServer: true, secureContext: this.context.ctx, requestCert: true, rejectUnauthorized: false, ALPNProtocols: [E2E_ALPN] });
    const timeoutMs = this.options.handshakeTimeoutMs ?? E2E_HANDSHAKE_TIMEOUT_MS;
    const timer = setTimeout(() => {
      this.options.log.warn({ timeoutMs }, 'the client of an end-to-end stream did not complete TLS in time; closing');
      tlsSocket.destroy();
      socket.destroy();
    }, timeoutMs);
    timer.unref();
    tlsSocket.on('error', (err) => {
      clearTimeout(timer);
      this.options.log.info({ err: err.message }, 'end-to-end stream: TLS with the client failed');
      tlsSocket.destroy();
      socket.destroy();
    });
    tlsSocket.once('close', () => socket.destroy());
    tlsSocket.once('secure', () => {
      clearTimeout(timer);
      recordClientVerification(tlsSocket);
      onSecure(tlsSocket);
    });
  }

  private refuse(socket: TLSSocket, why: string, m: E2EOpenMessage, grant: E2EGrant | undefined): void {
    const e = new GatewayError('GW_ERR_E2E_REFUSED', `the agent refused the end-to-end stream: ${why}`);
    this.options.log.warn({ code: e.code, why, grant: grant?.id, user: grant?.sub, client: m.client_src }, 'end-to-end stream refused');
    socket.end(`${JSON.stringify({ ok: false, error: { code: e.code, message: e.message } } satisfies DialAnswer)}\n`);
  }

  private serve(socket: TLSSocket, m: E2EOpenMessage, g: E2EGrant, tunnel: E2ETunnel): void {
    const entry: OpenStream = { user: g.sub, socket };
    this.open.add(entry);
    const request: DialRequest = {
      service: g.service,
      resource: g.resource,
      client_src: m.client_src,
      client_dst: m.client_dst,
      user: g.sub,
      // Inside the end-to-end TLS the end is said in frames: a Proxy that cuts the stream is a break at both ends.
      framed: true,
      ...(g.db_access ? { db_access: g.db_access } : {}),
      // A kube stream is served as HTTP here, impersonating from the grant (src/agent/kubeapi.ts).
      ...(g.kube_access ? { kube_access: g.kube_access } : {}),
      ...(m.traceparent ? { traceparent: m.traceparent } : {}),
      ...(m.tracestate ? { tracestate: m.tracestate } : {}),
    };
    let started: Record<string, unknown> | undefined;
    socket.once('close', () => {
      this.open.delete(entry);
      if (started) tunnel.sendEvent({ ...started, event: `${g.service}.session.end`, time: new Date(this.now()).toISOString() });
    });
    this.options.log.info({ user: g.sub, service: g.service, resource: g.resource, grant: g.id, client: m.client_src }, 'end-to-end stream opened');
    tunnel.serve(socket, request, (fields) => {
      if (g.service === 'ssh' || started) return; // the SSH Service reports its sessions
      started = { user: g.sub, resource: g.resource, node: this.options.identity.nodename, client: m.client_src, e2e: true, grant: g.id, ...fields };
      tunnel.sendEvent({ ...started, event: `${g.service}.session.start`, time: new Date(this.now()).toISOString() });
    });
  }
}
