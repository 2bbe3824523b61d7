/**
 * A Proxy in its own process: ProxyAuth over mutual TLS to the Auth API on 3025 (src/auth/proxyapi.ts), with the
 * Proxy's host certificate, through the process's Dialer.
 *
 *   calls       resolveCaller, resolveSshUser, rolesOf, revocationOf, getNode, setPresence, clearPresence,
 *               recordAgentEvent, recordProxyEvent, renewHost, heartbeatProxy, removeProxy, listProxies, listPresence, tunnelStrategy,
 *               issueServerCert, and the web's resolveWebSession, webSessionSshCert, createAppLaunch,
 *               redeemAppLaunch, resolveAppSession: one HTTPS request each, to the current Auth address; a failure to reach it moves
 *               on to the next address (gateway.auth_server may list several), and when none answers the call
 *               fails with GW_ERR_AUTH_UNREACHABLE naming them.
 *   events      ONE long-lived GET /v1/proxy/events (newline-delimited JSON, a keep-alive line every few seconds)
 *               feeds watchMaintenance, watchCluster and the revocations of the local SessionRegistry. On every
 *               (re)connect everything may have changed: every tracked session is re-checked, maintenance
 *               watchers fire and cluster watchers resync. It reconnects (EVENTS_RETRY): a stream that said
 *               hello after 100 ms, a failed try with backoff; while no Auth Service answers, what is open stays
 *               open.
 */
import https from 'node:https';
import { AUTOUPDATE_AUTH_INSTRUCTION_PATH, AUTOUPDATE_STATUS_PATH, type AgentInstruction, type RolloutStatus } from '../wire/autoupdate.js';
import { instructionQuery } from '../wire/autoupdatequery.js';
import type { IncomingMessage } from 'node:http';
import { formatHostPort, normalizeHost, parseAddr } from '../addr.js';
import { Backoff, type BackoffDeps, type BackoffPolicy } from '../backoff.js';
import { scopeFilter, type RevocationScope } from '../auth/callers.js';
import type { CertBundle, PublicCas } from '../wire/certs.js';
import type { RenewRequest } from '../auth/joining.js';
import type { Identity } from '../auth/pki.js';
import type { ClusterWatchHandlers, PresenceEvent, ProxyAuth, PublicAuthority, WebSessionView } from '../auth/proxyauth.js';
import type { NodeRecord, Presence, ProxyRecord, TunnelStrategy } from '../auth/records.js';
import type { Resource, RoleResource } from '../auth/resources/index.js';
import { SessionRegistry } from '../auth/sessions.js';
import type { AuthPreference } from '../auth/sso/index.js';
import { DialerAgent } from '../dial/agent.js';
import type { Dialer } from '../dial/dialer.js';
import { GatewayError, isErrorCode, isGatewayError } from '../errors.js';
import { logger } from '../log.js';
import { LineSplitter } from '../stream/splitter.js';
import { ApiClient, authServerIdentity, normalizeAuthAddress } from './api.js';

/** The Proxy's own identity: its host certificate and key, and the host CA the Auth API's certificate chains to. */
export interface RemoteCredentials {
  cert: string;
  key: string;
  hostCa: string;
  /** This Proxy's host ID (its proxyId). */
  hostId: string;
}

export interface RemoteProxyAuthOptions {
  /** Auth API addresses (host:port, default port 3025), tried in order. */
  addresses: readonly string[];
  credentials: RemoteCredentials;
  dialer: Dialer;
  /** Longest wait between reconnects of the event stream (ms; EVENTS_RETRY's maxMs otherwise). */
  maxBackoffMs?: number;
  /** The event stream reconnect's clock, timers and randomness (tests drive them; re-checks keep real timers). */
  backoffDeps?: BackoffDeps;
  /** A call's deadline (ms). */
  timeoutMs?: number;
}

/**
 * Reconnecting the event stream (docs/retries.md, "Retries"): a failed try waits 125-250 ms, doubling to
 * 2.5-5 s (equal jitter: the Proxies of a cluster do not all come back on one beat); the hello resets it.
 */
export const EVENTS_RETRY: BackoffPolicy = { firstMs: 250, maxMs: 5_000, jitter: 'equal' };
/** A stream that said hello and then ended reconnects this soon, to the same address first. */
export const EVENTS_RECONNECT_MS = 100;

/**
 * Re-checking open sessions the Auth Service could not answer for: 0.5 s, doubling to every 30 s. No jitter: one
 * Proxy's own re-checks, and the event stream's reconnect (jittered) already spreads the Proxies.
 */
export const RECHECK_RETRY: BackoffPolicy = { firstMs: 500, maxMs: 30_000, jitter: 'none' };

/** Longest event line accepted (a presence record with its resources). */
const MAX_EVENT_LINE = 512 * 1024;

type StreamEvent =
  | { type: 'hello'; keepalive_ms?: number }
  | { type: 'keepalive' }
  | { type: 'maintenance' }
  | { type: 'presence'; event: PresenceEvent }
  | { type: 'proxies' }
  | { type: 'resync' }
  | { type: 'revoke'; why?: string; scope: RevocationScope };

export class RemoteProxyAuth implements ProxyAuth {
  readonly sessions = new SessionRegistry();
  readonly addresses: string[];
  private current = 0;
  private clients: ApiClient[];
  private readonly maintenanceWatchers = new Set<() => void>();
  private readonly clusterWatchers = new Set<ClusterWatchHandlers>();
  private readonly log = logger('remoteauth');
  private stream: { destroy(): void } | undefined;
  private readonly backoff: Backoff;
  private closed = false;
  private connectedOnce = false;
  private trust!: { clusterName: string; host: PublicAuthority; user: PublicAuthority };

  private constructor(private readonly options: RemoteProxyAuthOptions) {
    if (options.addresses.length === 0) {
      throw new GatewayError('GW_ERR_USAGE', 'a Proxy without the Auth Service in its process needs the Auth API address', {
        hint: 'Set gateway.auth_server (or pass --auth-server host:3025).',
      });
    }
    this.addresses = options.addresses.map(normalizeAuthAddress);
    this.clients = this.makeClients();
    const maxMs = options.maxBackoffMs ?? EVENTS_RETRY.maxMs;
    this.backoff = new Backoff({ ...EVENTS_RETRY, firstMs: Math.min(EVENTS_RETRY.firstMs, maxMs), maxMs }, options.backoffDeps);
  }

  private makeClients(): ApiClient[] {
    const { cert, key, hostCa } = this.options.credentials;
    return this.addresses.map((address) => new ApiClient({ address, dialer: this.options.dialer, ca: hostCa, cert, key, server: 'auth', timeoutMs: this.options.timeoutMs ?? 15_000 }));
  }

  /** Fresh certificates for this Proxy's own key (POST /v1/agent/renew; src/agent/renewal.ts). */
  renewOwn(publicKeyPem: string): Promise<CertBundle> {
    return this.call<CertBundle>('POST', '/v1/agent/renew', { public_key: publicKeyPem });
  }

  /** From now on calls, the event stream's next connection and the forwarder present this certificate (same key). */
  useCertificate(cert: string): void {
    this.options.credentials.cert = cert;
    this.clients = this.makeClients();
  }

  /** Connects: the cluster's public CAs from the first Auth address that answers, then the event stream. */
  static async connect(options: RemoteProxyAuthOptions): Promise<RemoteProxyAuth> {
    const remote = new RemoteProxyAuth(options);
    const cas = await remote.call<PublicCas>('GET', '/webapi/ca');
    remote.trust = {
      clusterName: cas.cluster_name,
      host: { tls: { certPem: cas.host_ca }, ssh: { publicKey: cas.ssh_host_ca } },
      user: { tls: { certPem: cas.user_ca }, ssh: { publicKey: cas.ssh_user_ca } },
    };
    remote.openStream();
    return remote;
  }

  get clusterName(): string {
    return this.trust.clusterName;
  }

  get host(): PublicAuthority {
    return this.trust.host;
  }

  get user(): PublicAuthority {
    return this.trust.user;
  }

  /** auth_service.authentication of the cluster, for /webapi/ping (the front door caches it a few seconds). */
  authPreference(): Promise<AuthPreference> {
    return this.call<{ preference: AuthPreference }>('GET', '/v1/proxy/auth-preference').then((r) => r.preference);
  }

  /** The Auth API address calls go to now. */
  get address(): string {
    return this.addresses[this.current]!;
  }

  /** The credentials and address the web port's forwarder uses (src/client/forward.ts). */
  upstream(): { address: string; addresses: readonly string[]; cert: string; key: string; ca: string } {
    const { cert, key, hostCa } = this.options.credentials;
    return { address: this.address, addresses: this.addresses, cert, key, ca: hostCa };
  }

  /** Tells the forwarder an address did not answer: the next call starts at the next one. */
  failedOver(address: string): void {
    if (this.address === address && this.addresses.length > 1) this.current = (this.current + 1) % this.addresses.length;
  }

  /**
   * One call to the Auth API, at the current address and then at each other one while the failure is that it
   * could not be reached (an answer, even a refusal, ends the tries).
   */
  async call<T>(method: string, path: string, body?: unknown): Promise<T> {
    let last: unknown;
    for (let i = 0; i < this.addresses.length; i++) {
      const index = (this.current + i) % this.addresses.length;
      try {
        const result = await this.clients[index]!.call<T>(method, path, body);
        this.current = index;
        return result;
      } catch (err) {
        if (answered(err)) throw err;
        last = err;
        this.log.debug({ addr: this.addresses[index], err: (err as Error).message }, 'Auth API not reachable');
      }
    }
    throw unreachable(this.addresses, last);
  }

  resolveCaller(caller: Identity): Promise<Identity> {
    return this.call<{ identity: Identity }>('POST', '/v1/proxy/resolve-caller', { identity: caller }).then((r) => r.identity);
  }

  resolveSshUser(name: string, issuedAt?: number): Promise<Identity> {
    return this.call<{ identity: Identity }>('POST', '/v1/proxy/resolve-ssh-user', { name, ...(issuedAt === undefined ? {} : { issued_at: issuedAt }) }).then((r) => r.identity);
  }

  rolesOf(names: readonly string[]): Promise<RoleResource[]> {
    return this.call<{ roles: RoleResource[] }>('POST', '/v1/proxy/roles', { names }).then((r) => r.roles);
  }

  /** Undefined when the Auth Service cannot say (unreachable): what is open stays open (revalidate retries). */
  async revocationOf(identity: Identity): Promise<GatewayError | undefined> {
    try {
      return await this.checkRevocation(identity);
    } catch (err) {
      this.log.warn({ err: (err as Error).message, who: identity.name }, 'cannot re-check an identity; its sessions stay open');
      return undefined;
    }
  }

  /** Why the identity may no longer keep what it has open, or undefined; throws when the Auth Service cannot say. */
  private async checkRevocation(identity: Identity): Promise<GatewayError | undefined> {
    const { error } = await this.call<{ error: { code: string; message: string; hint?: string } | null }>('POST', '/v1/proxy/revocation', { identity });
    if (!error) return undefined;
    const code = isErrorCode(error.code) ? error.code : 'GW_ERR_AUTH_IDENTITY_REVOKED';
    return new GatewayError(code, error.message, error.hint ? { hint: error.hint } : {});
  }

  listNodes(): Promise<NodeRecord[]> {
    return this.call<{ nodes: NodeRecord[] }>('GET', '/v1/proxy/nodes').then((r) => r.nodes);
  }

  getNode(hostId: string): Promise<NodeRecord | undefined> {
    return this.call<{ node: NodeRecord | null }>('GET', `/v1/proxy/nodes/${encodeURIComponent(hostId)}`).then((r) => r.node ?? undefined);
  }

  async setPresence(presence: Presence, ttlMs: number): Promise<void> {
    await this.call('PUT', '/v1/proxy/presence', { presence, ttl_ms: ttlMs });
  }

  async clearPresence(hostId: string, _proxyId: string, connectedAt?: string): Promise<void> {
    // The Auth Service clears this Proxy's record only (the caller's host ID is its proxyId).
    const query = connectedAt === undefined ? '' : `?connected_at=${encodeURIComponent(connectedAt)}`;
    await this.call('DELETE', `/v1/proxy/presence/${encodeURIComponent(hostId)}${query}`);
  }

  /** The Auth Service records it via this Proxy (the caller) and the agent's joined nodename. */
  async recordAgentEvent(hostId: string, nodename: string, event: Record<string, unknown>): Promise<void> {
    await this.call('POST', '/v1/proxy/agent-events', { host_id: hostId, nodename, event });
  }

  /** The Auth Service records the event as this Proxy's (its certificate's host ID); _proxyId is not sent. */
  async recordProxyEvent(_proxyId: string, event: Record<string, unknown>): Promise<void> {
    await this.call('POST', '/v1/proxy/session-events', { event });
  }

  renewHost(request: RenewRequest): Promise<CertBundle & { hostId: string }> {
    return this.call('POST', '/v1/proxy/host-renewals', { host_id: request.hostId, public_key: request.publicKeyPem, ...(request.carried?.proof ? { proof: request.carried.proof } : {}) });
  }

  async heartbeatProxy(record: ProxyRecord, ttlMs: number): Promise<void> {
    await this.call('PUT', '/v1/proxy/proxies/self', { record, ttl_ms: ttlMs });
  }

  async removeProxy(_id: string): Promise<void> {
    await this.call('DELETE', '/v1/proxy/proxies/self');
  }

  listProxies(): Promise<ProxyRecord[]> {
    return this.call<{ proxies: ProxyRecord[] }>('GET', '/v1/proxy/proxies').then((r) => r.proxies);
  }

  listPresence(): Promise<Presence[]> {
    return this.call<{ presence: Presence[] }>('GET', '/v1/proxy/presence').then((r) => r.presence);
  }

  tunnelStrategy(): Promise<TunnelStrategy> {
    return this.call<{ strategy: TunnelStrategy }>('GET', '/v1/proxy/strategy').then((r) => r.strategy);
  }

  /** For this Proxy's own host ID, with the role proxy only, whatever hostId says. */
  issueServerCert(publicKeyPem: string, names: string[]): Promise<string> {
    return this.call<{ cert: string }>('POST', '/v1/proxy/server-cert', { public_key: publicKeyPem, names }).then((r) => r.cert);
  }

  watchMaintenance(onChange: () => void): () => void {
    this.maintenanceWatchers.add(onChange);
    return () => void this.maintenanceWatchers.delete(onChange);
  }

  maintenanceConfig(): Promise<Resource | undefined> {
    return this.call<{ config: Resource | null }>('GET', '/v1/proxy/maintenance').then((r) => r.config ?? undefined);
  }

  autoupdateInstruction(hostId: string, group?: string): Promise<AgentInstruction> {
    return this.call<AgentInstruction>('GET', `${AUTOUPDATE_AUTH_INSTRUCTION_PATH}?${instructionQuery({ hostId, ...(group === undefined ? {} : { group }) })}`);
  }

  /** As this Proxy (the route that asks checked its user's rule first): GET /v1/autoupdate/status. */
  autoupdateStatus(): Promise<RolloutStatus> {
    return this.call<RolloutStatus>('GET', AUTOUPDATE_STATUS_PATH);
  }

  watchCluster(handlers: ClusterWatchHandlers): () => void {
    this.clusterWatchers.add(handlers);
    return () => void this.clusterWatchers.delete(handlers);
  }

  /** Ends the event stream (what is open on the Proxy is closed by its own stop order). */
  close(): void {
    this.closed = true;
    this.backoff.stop();
    this.stream?.destroy();
  }

  /** The event stream at the current address (after a failed try, the next address; EVENTS_RETRY counts the tries). */
  private openStream(): void {
    if (this.closed) return;
    const index = this.current % this.addresses.length;
    const address = this.addresses[index]!;
    let healthy = false;
    const retry = (why: string) => {
      if (this.closed || this.stream !== req) return;
      this.stream = undefined;
      this.log.warn({ addr: address, why }, healthy ? 'Auth API event stream ended; reconnecting' : 'Auth API event stream failed; reconnecting');
      // A stream that worked reconnects at once, to the same address first; a failed try moves to the next one.
      if (!healthy) this.current = (index + 1) % this.addresses.length;
      this.backoff.schedule(() => this.openStream(), healthy ? EVENTS_RECONNECT_MS : this.backoff.next());
    };
    const req = this.requestStream(address, (res) => {
      if (res.statusCode !== 200) {
        res.resume();
        res.once('end', () => retry(`status ${res.statusCode}`));
        return;
      }
      const splitter = new LineSplitter(MAX_EVENT_LINE, 'event line');
      let watchdog: NodeJS.Timeout | undefined;
      const arm = (ms: number) => {
        clearTimeout(watchdog);
        watchdog = setTimeout(() => req.destroy(new Error(`no keep-alive within ${ms} ms`)), ms);
      };
      let keepAliveMs = 5000;
      arm(keepAliveMs * 3);
      res.on('data', (chunk: Buffer) => {
        let rest = chunk;
        try {
          for (;;) {
            const r = splitter.feed(rest);
            if (r.kind === 'need-more') break;
            rest = r.rest;
            const event = JSON.parse(r.line.toString('utf8')) as StreamEvent;
            if (event.type === 'hello') {
              healthy = true;
              this.backoff.up();
              this.current = index;
              if (typeof event.keepalive_ms === 'number' && event.keepalive_ms > 0) keepAliveMs = event.keepalive_ms;
            }
            arm(keepAliveMs * 3);
            this.dispatch(event);
          }
        } catch (err) {
          req.destroy(err as Error);
        }
      });
      res.once('close', () => {
        clearTimeout(watchdog);
        retry('the stream closed');
      });
    });
    this.stream = req;
    req.on('error', (err) => retry(err.message));
    req.on('close', () => retry('the connection closed'));
  }

  private requestStream(address: string, onResponse: (res: IncomingMessage) => void): ReturnType<typeof https.request> {
    const { host, port } = parseAddr(address);
    const { cert, key, hostCa } = this.options.credentials;
    const agent = new DialerAgent(this.options.dialer);
    const req = https.request({ hostname: normalizeHost(host), port: port ?? 3025, path: '/v1/proxy/events', method: 'GET', agent, ca: hostCa, cert, key, checkServerIdentity: authServerIdentity, timeout: this.options.timeoutMs ?? 15_000 }, (res) => {
      req.setTimeout(0);
      onResponse(res);
    });
    req.on('timeout', () => req.destroy(new Error('no answer')));
    req.on('close', () => agent.destroy());
    req.end();
    return req;
  }

  private dispatch(event: StreamEvent): void {
    switch (event.type) {
      case 'hello':
        // Connected (again): anything may have changed while this Proxy was not listening.
        if (this.connectedOnce) this.log.info({ addr: this.address }, 'Auth API event stream reconnected; re-checking everything');
        this.connectedOnce = true;
        this.revalidate({ kind: 'all' }, 'event stream (re)connected');
        for (const w of [...this.maintenanceWatchers]) w();
        for (const h of [...this.clusterWatchers]) h.resync();
        return;
      case 'maintenance':
        for (const w of [...this.maintenanceWatchers]) w();
        return;
      case 'presence':
        for (const h of [...this.clusterWatchers]) h.presence(event.event);
        return;
      case 'proxies':
        for (const h of [...this.clusterWatchers]) h.proxies();
        return;
      case 'resync':
        for (const h of [...this.clusterWatchers]) h.resync();
        return;
      case 'revoke':
        this.revalidate(event.scope, event.why ?? 'revocation');
        return;
      default:
    }
  }

  /**
   * Re-checks the open sessions in scope. An identity the Auth Service could not check (a 503, a timeout, a
   * fail-over) is not taken as cleared: the check runs again (RECHECK_RETRY, each re-check its own sequence) until
   * it gets an answer, so a lock that lands while the Auth Service is failing over still closes what it names.
   */
  private revalidate(scope: RevocationScope, why: string, backoff = new Backoff(RECHECK_RETRY, { unref: true })): void {
    let unanswered = 0;
    const check = async (id: Identity): Promise<GatewayError | undefined> => {
      try {
        return await this.checkRevocation(id);
      } catch {
        unanswered++;
        return undefined;
      }
    };
    this.sessions
      .revalidate(check, scopeFilter(scope))
      .then((closed) => {
        for (const s of closed) this.log.info({ who: s.identity.name, kind: s.identity.kind, what: s.what, why }, 'session closed: identity revoked');
        if (unanswered === 0 || this.closed) return;
        const delay = backoff.schedule(() => this.revalidate(scope, why, backoff));
        this.log.warn({ unanswered, why, retryInMs: delay }, 'cannot re-check some open sessions; trying again');
      })
      .catch((err: unknown) => this.log.warn({ err: (err as Error).message }, 'cannot re-check open sessions'));
  }

  // --- the web (src/auth/websessions.ts): the secrets go in bodies, never in paths -----------------------------------
  resolveWebSession(id: string, bearer: string | undefined): Promise<WebSessionView> {
    return this.call<{ session: WebSessionView }>('POST', '/v1/proxy/web-sessions/resolve', { id, ...(bearer === undefined ? {} : { bearer }) }).then((r) => r.session);
  }

  webSessionSshCert(id: string, bearer: string | undefined, sshPublicKey: string): Promise<{ ssh_cert: string }> {
    return this.call<{ ssh_cert: string }>('POST', '/v1/proxy/web-sessions/ssh-cert', { id, ...(bearer === undefined ? {} : { bearer }), ssh_public_key: sshPublicKey });
  }

  createAppLaunch(id: string, bearer: string | undefined, app: string, state: string): Promise<{ token: string }> {
    return this.call<{ token: string }>('POST', '/v1/proxy/app-launches', { id, ...(bearer === undefined ? {} : { bearer }), app, state });
  }

  redeemAppLaunch(token: string, app: string, state: string): Promise<{ sessionId: string; expiresAt: number }> {
    return this.call<{ session_id: string; expires_at: number }>('POST', '/v1/proxy/app-launches/redeem', { token, app, state }).then((r) => ({ sessionId: r.session_id, expiresAt: r.expires_at }));
  }

  resolveAppSession(sessionId: string, app: string): Promise<WebSessionView> {
    return this.call<{ session: WebSessionView }>('POST', '/v1/proxy/app-sessions/resolve', { session_id: sessionId, app }).then((r) => r.session);
  }
}

/** An answer from an Auth Service (a refusal included), as opposed to not reaching one. */
function answered(err: unknown): boolean {
  return isGatewayError(err) && typeof (err.details as { status?: unknown } | undefined)?.status === 'number';
}

export function unreachable(addresses: readonly string[], cause: unknown): GatewayError {
  const why = cause instanceof Error ? cause.message : String(cause);
  return new GatewayError('GW_ERR_AUTH_UNREACHABLE', `this Proxy cannot reach the Auth Service at ${addresses.join(', ')}: ${why}`, {
    hint: `Check that the Auth Service at ${addresses.map((a) => formatHostPort(parseAddr(a).host, parseAddr(a).port ?? 3025)).join(' or ')} runs and that this machine reaches it; the Proxy reconnects by itself, open connections stay open.`,
    ...(cause instanceof Error ? { cause } : {}),
  });
}
