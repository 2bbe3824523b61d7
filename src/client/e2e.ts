/**
 * gwsh's side of end-to-end streams (the contract: src/tunnel/e2e.ts; the prose: docs/tunnels.md, "End-to-end
 * streams: the client"). Three pieces, each deciding one thing:
 *
 *   GrantSession   one TLS connection to the Proxy (ALPN gateway-grant-v1, the user certificate, the Proxy's
 *                  certificate checked as for every classic route), opened on first need and kept; GrantRequest
 *                  lines out, GrantAnswer lines back matched by id (any order), a deadline per request, at most
 *                  GRANT_SESSION_INFLIGHT_MAX in flight (the rest wait, under the same deadline). A Proxy that
 *                  answers the TLS alert no_application_protocol or picks another ALPN is of an earlier version:
 *                  remembered for the process, never asked again. A session that closes is opened again on the
 *                  next request; a request sent on a reused session that closes unanswered (the Proxy's idle close
 *                  crossing it) is sent once more on a new one.
 *   connectE2E     raw TCP to the Proxy's address through the Dialer (as the classic routes: HTTPS_PROXY, the
 *                  connection upgrade past an inspecting proxy), the stream line `GWE2E1 <grant>` (any Proxy of
 *                  the cluster routes it: behind a load balancer the stream need not land on the grant's Proxy),
 *                  then TLS with the *agent*: ALPN gateway-e2e-v1, the grant's server name, the user certificate, TLS 1.3 only (a context of its own: e2eTlsContext),
 *                  trust = the cluster's host CA only, and instead of a name check agentServerIdentity: a host
 *                  certificate of this cluster whose host ID is the grant answer's agent and whose roles include
 *                  the service's system role. Then one DialAnswer line (framed: true → read as frames).
 *   E2EStreams     per connection, by mode: off → the classic route (openResource's route header, or the
 *                  caller's own opener: gwsh proxy kube's TLS to the kube route, src/client/kubeproxy.ts);
 *                  auto → a grant, then the end-to-end connection, the classic route when the Proxy says
 *                  `classic`, takes no grant requests, answers the request GW_ERR_TUNNEL_PROTOCOL (an earlier
 *                  version's answer to a route it gives no grants for: the kube route), the route is one this
 *                  version has no end-to-end stream for (a newer Proxy's database protocol), or the connection
 *                  fails BEFORE a certificate was presented and checked; require → those are
 *                  GW_ERR_E2E_UNAVAILABLE instead. A refused grant, a certificate that is not the agent's
 *                  (GW_ERR_E2E_AGENT) and anything after the agent's certificate passed (its refusal in the
 *                  DialAnswer, a broken stream) are errors, never a fallback: the fallback is for Proxies and
 *                  agents of earlier versions, and a Proxy that wants the classic route can say so (under auto it
 *                  gets it: docs/security.md).
 *
 * Nothing here logs a grant (it is a credential for GRANT_TTL_MS); the Proxy's and the agent's words are printed
 * bounded and without control characters.
 */
import type { Duplex } from 'node:stream';
import type tls from 'node:tls';
import { createSecureContext, type PeerCertificate } from 'node:tls';
import { parseAddr } from '../addr.js';
import { identityFromCert } from '../auth/pki.js';
import { connectClusterTls } from '../dial/fallback.js';
import type { Dialer } from '../dial/dialer.js';
import { tlsVerifyError, UNTRUSTED_HINTS } from '../dial/tlsverify.js';
import { GatewayError, isErrorCode, toGatewayError } from '../errors.js';
import { FramedStream } from '../stream/framed.js';
import { readJsonLine } from '../stream/lines.js';
import { LineSplitter } from '../stream/splitter.js';
import { handshakeFailure } from '../stream/tls.js';
import { envTraceContext, traceFields } from '../trace.js';
import {
  decodeGrant,
  E2E_ALPN,
  e2eLine,
  GRANT_ALPN,
  GRANT_LINE_MAX_BYTES,
  GRANT_SESSION_INFLIGHT_MAX,
  GRANT_TOKEN_MAX_BYTES,
  grantIdOfServerName,
  type GrantAnswer,
  type GrantRequest,
} from '../tunnel/e2e.js';
import { SERVICE_ROLE, type DialAnswer, type ServiceKind } from '../tunnel/protocol.js';
import { wireRowOfAlpn } from '../wire/protocols.js';
import { proxyServerIdentity } from './api.js';
import type { Profile } from './profile.js';
import { openResource, type ResourceTarget } from './resources.js';

export const E2E_MODES = ['auto', 'require', 'off'] as const;
export type E2EMode = (typeof E2E_MODES)[number];
/** The environment variable that sets the mode when --e2e is not given. */
export const E2E_ENV = 'GWSH_E2E';

/** How long a grant request may wait for its answer (its slot and the session's opening included). */
export const GRANT_ANSWER_TIMEOUT_MS = 10_000;
/** Requests waiting for a slot on the session beyond the in-flight cap; past this many the next falls back. */
export const GRANT_QUEUE_MAX = 256;
/** The agent's DialAnswer line: its cap and deadline (the agent dials the resource first, as on the classic route). */
export const E2E_ANSWER_MAX_BYTES = 4096;
export const E2E_ANSWER_TIMEOUT_MS = 60_000;

/** --e2e, else GWSH_E2E, else auto; anything else is a usage error. */
export function e2eModeOf(flag: string | undefined, env: NodeJS.ProcessEnv = process.env): E2EMode {
  const given = flag ?? env[E2E_ENV];
  const source = flag !== undefined ? '--e2e' : E2E_ENV;
  if (given === undefined || given === '') return 'auto';
  if ((E2E_MODES as readonly string[]).includes(given)) return given as E2EMode;
  throw new GatewayError('GW_ERR_USAGE', `${source}: "${printable(given, 40)}" is not one of ${E2E_MODES.join(', ')}`, {
    hint: 'Give --e2e auto (end-to-end when the Proxy and the agent can, else the classic route), require (end-to-end or nothing) or off (the classic route).',
  });
}

/** The kube route's name (src/wire/protocols.ts): a ResourceTarget's `alpn` for Kubernetes (routed by server name, not ALPN). */
export const KUBE_ROUTE = 'kube';

/**
 * The service a classic route reaches, as grants and system roles name it; undefined for a route this version
 * does not know (a database protocol of a newer Proxy, which gwsh reaches by the classic route only).
 */
export function serviceOfTarget(target: Pick<ResourceTarget, 'alpn' | 'kind'>): ServiceKind | undefined {
  if (target.alpn === 'gateway-proxy-ssh') return 'ssh';
  if (target.alpn === 'gateway-tcp') return target.kind === 'desktop' ? 'desktop' : 'app';
  if (target.alpn === KUBE_ROUTE) return 'kube';
  if (wireRowOfAlpn(target.alpn)?.database) return 'db';
  return undefined;
}

/** Text from a peer, for a terminal: at most max characters, control characters as '?'. */
function printable(text: unknown, max = 300): string {
  const s = String(text);
  // eslint-disable-next-line no-control-regex
  return (s.length > max ? `${s.slice(0, max)}…` : s).replace(/[\u0000-\u001f\u007f-\u009f]/g, '?');
}

/**
 * The server-certificate check of an end-to-end stream, in place of Node's name check (the server name is the
 * grant's, no certificate holds it): the certificate already chained to the host CA (the only CA trusted); it must
 * carry a host identity of this cluster named `agent` with the service's system role. Any host of the cluster
 * (another agent, a Proxy) chains to the same CA, so the chain alone says nothing about which one answered.
 */
export function agentServerIdentity(expect: { cluster: string; agent: string; service: ServiceKind }): (host: string, cert: PeerCertificate) => Error | undefined {
  const role = SERVICE_ROLE[expect.service];
  return (_host, cert) => {
    const refuse = (what: string) =>
      new GatewayError('GW_ERR_E2E_AGENT', `the end-to-end stream reached ${what}, not the agent ${printable(expect.agent, 64)} the grant names (a host of cluster "${printable(expect.cluster, 64)}" with the role ${role}); nothing was sent to it`, {
        details: { expected_agent: expect.agent, expected_role: role },
      });
    let id;
    try {
      id = identityFromCert(cert.raw);
    } catch (err) {
      return refuse(`a certificate without a cluster identity (${(err as Error).message})`);
    }
    const who = `a ${id.kind} certificate of "${printable(id.name, 64)}" (cluster "${printable(id.cluster, 64)}", roles ${printable(id.roles.join(', ') || 'none', 200)})`;
    if (id.kind !== 'host' || id.cluster !== expect.cluster || id.name !== expect.agent || !id.roles.includes(role)) return refuse(who);
    return undefined;
  };
}

/** A grant the Proxy gave: what the end-to-end connection needs. */
export interface GrantOk {
  grant: string;
  agent: string;
  server_name: string;
  expires: number;
}

/** A grant, or why this connection takes the classic route (the mode decides whether it may). */
export type GrantOutcome = { kind: 'grant'; grant: GrantOk } | { kind: 'classic'; reason: string };

/** Why a parsed answer line is not a GrantAnswer this client can use, or undefined. */
export function badGrantAnswer(v: Record<string, unknown>): string | undefined {
  if (!Number.isSafeInteger(v.id)) return 'its id is not a number';
  if (v.ok === true) {
    if (typeof v.grant !== 'string' || v.grant.length === 0 || v.grant.length > GRANT_TOKEN_MAX_BYTES) return 'its grant is not a token';
    if (typeof v.agent !== 'string' || v.agent.length === 0 || v.agent.length > 1024) return 'its agent is not a host ID';
    if (typeof v.server_name !== 'string' || grantIdOfServerName(v.server_name) === undefined) return 'its server_name is not a grant\'s';
    if (!Number.isSafeInteger(v.expires)) return 'its expiry is not a time';
    const decoded = decodeGrant(v.grant);
    // The grant is the Proxy's to sign and the agent's to check; here only that it names what the answer names.
    if (decoded.ok && (decoded.grant.agent !== v.agent || grantIdOfServerName(v.server_name) !== decoded.grant.id)) return 'its grant names another agent or id than the answer';
    return undefined;
  }
  if (v.ok !== false) return 'ok is not a boolean';
  if (v.classic === true) return typeof v.reason === 'string' ? undefined : 'its reason is not text';
  const e = v.error as Record<string, unknown> | undefined;
  if (typeof e !== 'object' || e === null || typeof e.code !== 'string' || typeof e.message !== 'string') return 'its error has no code and message';
  return undefined;
}

export interface GrantSessionOptions {
  profile: Profile;
  dialer: Dialer;
  /** The Proxy's one port (its web address). */
  address: string;
  secureContext?: tls.SecureContext;
  timeoutMs?: number;
}

interface Waiting {
  resolve(answer: GrantAnswer): void;
  reject(err: Error): void;
}

/** Why a session connection ended: retryable when the Proxy closed it (not a deadline of ours, not a bad line). */
interface Ended {
  reason: string;
  retryable: boolean;
}

/** One open grant session: the TLS connection, the answers awaited by id. */
class SessionConn {
  private readonly waiting = new Map<number, Waiting>();
  private readonly splitter = new LineSplitter(GRANT_LINE_MAX_BYTES, "the Proxy's grant answer");
  ended: Ended | undefined;

  constructor(readonly socket: tls.TLSSocket) {
    socket.on('data', (chunk: Buffer) => this.onData(chunk));
    socket.on('error', (err) => this.end({ reason: `the grant session failed: ${printable(err.message)}`, retryable: true }));
    socket.on('close', () => this.end({ reason: 'the Proxy closed the grant session', retryable: true }));
    socket.on('end', () => this.end({ reason: 'the Proxy closed the grant session', retryable: true }));
  }

  send(request: GrantRequest): Promise<GrantAnswer> {
    if (this.ended) return Promise.reject(new SessionEnded(this.ended));
    return new Promise<GrantAnswer>((resolve, reject) => {
      this.waiting.set(request.id, { resolve, reject });
      this.socket.write(`${JSON.stringify(request)}\n`);
    });
  }

  forget(id: number): void {
    this.waiting.delete(id);
  }

  end(why: Ended): void {
    if (this.ended) return;
    this.ended = why;
    this.socket.destroy();
    for (const w of this.waiting.values()) w.reject(new SessionEnded(why));
    this.waiting.clear();
  }

  private onData(chunk: Buffer): void {
    let lines: Buffer[];
    try {
      lines = this.splitter.lines(chunk);
    } catch (err) {
      return this.end({ reason: (err as Error).message, retryable: false });
    }
    for (const line of lines) {
      let v: unknown;
      try {
        v = JSON.parse(line.toString('utf8'));
      } catch {
        return this.end({ reason: "the Proxy's grant answer is not JSON", retryable: false });
      }
      const bad = typeof v === 'object' && v !== null && !Array.isArray(v) ? badGrantAnswer(v as Record<string, unknown>) : 'it is not an object';
      if (bad) return this.end({ reason: `the Proxy's grant answer is not one: ${bad}`, retryable: false });
      const answer = v as GrantAnswer;
      const w = this.waiting.get(answer.id);
      // An answer to no request of ours (a late one after its deadline, or a lying Proxy's) changes nothing.
      if (!w) continue;
      this.waiting.delete(answer.id);
      w.resolve(answer);
    }
  }
}

class SessionEnded extends Error {
  constructor(readonly why: Ended) {
    super(why.reason);
  }
}

/** A failure that sends this connection to the classic route (the caller's mode decides). */
class Classic extends Error {}

/** The grant session of this process (one per Proxy address). */
export class GrantSession {
  private conn: Promise<SessionConn> | undefined;
  /** The session conn resolved to, once open. */
  private live: SessionConn | undefined;
  private unavailable: string | undefined;
  private nextId = 1;
  private inflight = 0;
  private readonly queue: Array<() => void> = [];
  private closed = false;

  constructor(private readonly options: GrantSessionOptions) {}

  /** Why this Proxy gives no grants at all, once that is known (an earlier version), else undefined. */
  get noE2E(): string | undefined {
    return this.unavailable;
  }

  /**
   * A grant for this route, or `classic` with the reason; rejects with the Proxy's error when it refuses the
   * route itself (as the classic route would refuse it).
   */
  async request(req: Omit<GrantRequest, 'id'>): Promise<GrantOutcome> {
    if (this.unavailable) return { kind: 'classic', reason: this.unavailable };
    const timeoutMs = this.options.timeoutMs ?? GRANT_ANSWER_TIMEOUT_MS;
    const deadline = Date.now() + timeoutMs;
    let timer: NodeJS.Timeout | undefined;
    const expired = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Classic(`the Proxy did not answer the grant request within ${timeoutMs} ms`)), timeoutMs);
    });
    let slot = false;
    let abandoned = false;
    // A slot granted after this request gave up is handed straight back.
    const granted = this.slot().then(() => (abandoned ? this.release() : (slot = true)));
    try {
      await Promise.race([granted, expired]);
      const answer = await this.ask(req, expired, deadline);
      return this.outcome(answer);
    } catch (err) {
      if (err instanceof Classic) return { kind: 'classic', reason: err.message };
      throw err;
    } finally {
      abandoned = true;
      clearTimeout(timer);
      if (slot) this.release();
    }
  }

  /** Closes the session (the process is done with it). */
  close(): void {
    this.closed = true;
    void this.conn?.then((c) => c.end({ reason: 'gwsh closed the grant session', retryable: false }), () => undefined);
    this.conn = undefined;
  }

  private outcome(answer: GrantAnswer): GrantOutcome {
    if (answer.ok) return { kind: 'grant', grant: { grant: answer.grant, agent: answer.agent, server_name: answer.server_name, expires: answer.expires } };
    if ('classic' in answer) return { kind: 'classic', reason: `the Proxy answered: ${printable(answer.reason)}` };
    // The Proxy takes grant requests but not for this route (an earlier version: grants for Kubernetes came later):
    // the classic route carries it, as for a Proxy that takes no grant requests at all.
    if (answer.error.code === 'GW_ERR_TUNNEL_PROTOCOL') return { kind: 'classic', reason: `the Proxy gives no grants for this route (an earlier version): ${printable(answer.error.message)}` };
    const code = isErrorCode(answer.error.code) ? answer.error.code : 'GW_ERR_TUNNEL_DIAL_FAILED';
    throw new GatewayError(code, printable(answer.error.message, 1000), answer.error.hint ? { hint: printable(answer.error.hint, 1000) } : {});
  }

  /** Sends on the open session (opening one if needed); once more on a new session when a reused one closed under it. */
  private async ask(req: Omit<GrantRequest, 'id'>, expired: Promise<never>, deadline: number): Promise<GrantAnswer> {
    for (let attempt = 0; ; attempt++) {
      // Reused: a session already open before this request (an idle close of the Proxy's may cross it).
      const reused = this.live !== undefined && !this.live.ended;
      const conn = await Promise.race([this.session(deadline), expired]);
      const id = this.nextId++;
      try {
        return await Promise.race([conn.send({ id, ...req }), expired]);
      } catch (err) {
        conn.forget(id);
        // An ended session is replaced by the next session() call (it looks at `ended`), not cleared here: another
        // request may already have opened its successor.
        if (err instanceof SessionEnded) {
          if (err.why.retryable && reused && attempt === 0) continue;
          throw new Classic(err.why.reason);
        }
        // Our deadline: a Proxy that does not answer is not asked again on this connection.
        conn.end({ reason: (err as Error).message, retryable: false });
        throw err;
      }
    }
  }

  private session(deadline: number): Promise<SessionConn> {
    if (this.closed) return Promise.reject(new Classic('the grant session is closed'));
    const current = this.conn;
    if (current) {
      return current.then((c) => {
        if (!c.ended) return c;
        if (this.conn === current) this.conn = undefined;
        return this.session(deadline);
      });
    }
    const opening = this.open(deadline);
    this.conn = opening;
    opening.catch(() => {
      if (this.conn === opening) this.conn = undefined;
    });
    return opening;
  }

  private async open(deadline: number): Promise<SessionConn> {
    const { profile, dialer, address, secureContext } = this.options;
    const host = parseAddr(address).host;
    const credentials = secureContext ? { secureContext } : { ca: profile.hostCa, cert: profile.cert, key: profile.key };
    const tlsOptions = { ALPNProtocols: [GRANT_ALPN], ...credentials, host, checkServerIdentity: proxyServerIdentity, handshakeTimeoutMs: Math.max(1, deadline - Date.now()) };
    let socket: tls.TLSSocket;
    try {
      socket = await connectClusterTls(dialer, address, tlsOptions, { peer: { server: 'proxy', untrustedHint: UNTRUSTED_HINTS.clusterCa(address) }, clusterCa: profile.hostCa, webAddress: profile.proxy });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ERR_SSL_TLSV1_ALERT_NO_APPLICATION_PROTOCOL') throw this.remember(`the Proxy at ${address} does not take grant requests (ALPN ${GRANT_ALPN}): an earlier version`);
      const e = tlsVerifyError(err, { address, server: 'proxy', untrustedHint: UNTRUSTED_HINTS.clusterCa(address) }) ?? toGatewayError(err);
      throw new Classic(`the grant session to ${address} could not be opened: ${printable(e.message)}`);
    }
    if (socket.alpnProtocol !== GRANT_ALPN) {
      socket.destroy();
      throw this.remember(`the Proxy at ${address} does not take grant requests (it chose ALPN ${printable(socket.alpnProtocol || 'none', 64)}): an earlier version`);
    }
    this.live = new SessionConn(socket);
    return this.live;
  }

  private remember(reason: string): Classic {
    this.unavailable = reason;
    return new Classic(reason);
  }

  private slot(): Promise<void> {
    if (this.inflight < GRANT_SESSION_INFLIGHT_MAX) {
      this.inflight++;
      return Promise.resolve();
    }
    if (this.queue.length >= GRANT_QUEUE_MAX) return Promise.reject(new Classic(`more than ${GRANT_QUEUE_MAX} grant requests are waiting`));
    return new Promise<void>((resolve) => this.queue.push(resolve));
  }

  private release(): void {
    const next = this.queue.shift();
    if (next) next(); // the slot passes on
    else this.inflight--;
  }
}

/** The end-to-end connection: the stream, or why it failed before any certificate was checked (fallback-able). */
export type E2EConnect = { ok: true; stream: Duplex } | { ok: false; reason: string };

/** The user's credentials and the host CA for end-to-end streams: TLS 1.3 only (a context's own setting). */
export function e2eTlsContext(profile: Profile): tls.SecureContext {
  return createSecureContext({ ca: profile.hostCa, cert: profile.cert, key: profile.key, minVersion: 'TLSv1.3' });
}

export interface E2EConnectOptions {
  /** Made by e2eTlsContext (a context made otherwise may allow TLS 1.2: minVersion is the context's, not the call's). */
  secureContext?: tls.SecureContext;
  handshakeTimeoutMs?: number;
  answerTimeoutMs?: number;
}

/**
 * TLS with the agent through the Proxy's one port, checked against the grant's agent, and its DialAnswer. Rejects
 * (never `ok: false`) once a certificate was presented: GW_ERR_E2E_AGENT when it is not the agent's, the agent's
 * refusal with its code, a broken or silent stream.
 */
export async function connectE2E(profile: Profile, dialer: Dialer, address: string, grant: GrantOk, service: ServiceKind, options: E2EConnectOptions = {}): Promise<E2EConnect> {
  const host = parseAddr(address).host;
  const secureContext = options.secureContext ?? e2eTlsContext(profile);
  const check = agentServerIdentity({ cluster: profile.cluster, agent: grant.agent, service });
  let checked = false;
  const tlsOptions = {
    ALPNProtocols: [E2E_ALPN],
    secureContext,
    host,
    servername: grant.server_name,
    checkServerIdentity: (name: string, cert: PeerCertificate) => {
      checked = true;
      return check(name, cert);
    },
    ...(options.handshakeTimeoutMs ? { handshakeTimeoutMs: options.handshakeTimeoutMs } : {}),
  };
  let socket: tls.TLSSocket;
  try {
    socket = await connectClusterTls(dialer, address, tlsOptions, {
      peer: { server: 'proxy', untrustedHint: UNTRUSTED_HINTS.clusterCa(address) },
      clusterCa: profile.hostCa,
      webAddress: profile.proxy,
      // The grant ahead of the TLS: whichever Proxy of the cluster the connection lands on routes it by this line.
      preface: e2eLine(grant.grant),
    });
  } catch (err) {
    return handshakeRefused(err, address, grant.agent);
  }
  // Node skips the identity check on a resumed session; none is offered here, but the stream is only used checked.
  // (The certificate is read again only then: getPeerCertificate builds the whole object, a profile's top item.)
  const again = checked ? undefined : check(grant.server_name, socket.getPeerCertificate());
  if (again) {
    socket.destroy();
    throw again;
  }
  return { ok: true, stream: await agentAnswer(socket, grant.agent, options.answerTimeoutMs ?? E2E_ANSWER_TIMEOUT_MS) };
}

/** A failed handshake: after a certificate was presented and refused, an error; before, the reason to fall back. */
function handshakeRefused(err: unknown, address: string, agent: string): E2EConnect {
  if (err instanceof GatewayError && err.code === 'GW_ERR_E2E_AGENT') throw err;
  const presented = handshakeFailure(err)?.chain;
  const verdict = tlsVerifyError(err, { address, server: 'proxy', untrustedHint: UNTRUSTED_HINTS.clusterCa(address) });
  // A TLS-inspecting proxy's certificate is the path's, not an answer of the agent's: the classic route meets the
  // same proxy and says what to do about it.
  if (presented && presented.length > 0 && verdict?.code !== 'GW_ERR_TLS_INSPECTED') {
    const issuer = presented[0]!.issuer || 'an unknown issuer';
    throw new GatewayError('GW_ERR_E2E_AGENT', `the end-to-end stream reached a certificate that did not pass the check against the cluster's host CA (issued by ${printable(issuer, 200)}: ${printable(verdict?.message ?? (err as Error).message)}), not the agent ${printable(agent, 64)}; nothing was sent to it`, {
      details: { expected_agent: agent },
    });
  }
  const e = verdict ?? toGatewayError(err);
  return { ok: false, reason: `the end-to-end connection through ${address} failed before the agent answered: ${printable(e.message)}` };
}

/** The agent's DialAnswer line inside the TLS: bounded, with a deadline; a refusal with its code. */
async function agentAnswer(socket: tls.TLSSocket, agent: string, timeoutMs: number): Promise<Duplex> {
  let answer: DialAnswer;
  try {
    answer = await readJsonLine<DialAnswer>(socket, { what: `the agent ${printable(agent, 64)}'s answer`, timeoutMs, maxBytes: E2E_ANSWER_MAX_BYTES });
  } catch (err) {
    socket.destroy();
    throw err;
  }
  if (answer.ok === true) return answer.framed === true ? new FramedStream(socket) : socket;
  socket.destroy();
  const e = (answer as { error?: { code?: unknown; message?: unknown } }).error;
  const code = typeof e?.code === 'string' && isErrorCode(e.code) ? e.code : 'GW_ERR_TUNNEL_DIAL_FAILED';
  throw new GatewayError(code, `the agent ${printable(agent, 64)} refused the end-to-end stream: ${printable(e?.message ?? 'no reason given', 1000)}`);
}

/** What carried a connection, for the line gwsh prints. */
export interface OpenedStream {
  stream: Duplex;
  e2e: boolean;
  /** The agent's host ID (end-to-end only). */
  agent?: string;
  /** Why the classic route carried it (auto), when end-to-end was tried. */
  reason?: string;
}

export interface E2EStreamsOptions {
  profile: Profile;
  dialer: Dialer;
  mode: E2EMode;
  /** Where the classic route goes (routeAddress), and the Proxy's one port for grants and end-to-end streams. */
  classicAddress: string;
  e2eAddress: string;
  /** The classic routes' context (resourceTlsContext), for the grant session and the classic route; end-to-end streams make their own. */
  secureContext?: tls.SecureContext;
  /** Where a line about each connection's path goes (gwsh --debug). */
  debug?: (line: string) => void;
  grantTimeoutMs?: number;
  connect?: E2EConnectOptions;
  /**
   * How the classic route is opened, when it is not openResource's (a route header after TLS with the route's
   * ALPN): gwsh proxy kube's, TLS to the Proxy's kube route by its server name (src/client/kubeproxy.ts).
   */
  classic?: (target: ResourceTarget) => Promise<Duplex>;
}

/** Each connection of a gwsh command: end-to-end or classic, as the mode says (the one place that decides). */
export class E2EStreams {
  private readonly session: GrantSession | undefined;
  /** The end-to-end streams' own context: the classic routes' allows TLS 1.2. */
  private readonly e2eContext: tls.SecureContext | undefined;

  constructor(private readonly options: E2EStreamsOptions) {
    const { profile, dialer, e2eAddress, secureContext, grantTimeoutMs } = options;
    if (options.mode !== 'off') {
      this.e2eContext = e2eTlsContext(profile);
      this.session = new GrantSession({ profile, dialer, address: e2eAddress, ...(secureContext ? { secureContext } : {}), ...(grantTimeoutMs ? { timeoutMs: grantTimeoutMs } : {}) });
    }
  }

  async open(target: ResourceTarget): Promise<OpenedStream> {
    const { profile, dialer, classicAddress, secureContext } = this.options;
    const classic = async (reason?: string): Promise<OpenedStream> => {
      if (reason !== undefined && this.options.mode === 'require') {
        throw new GatewayError('GW_ERR_E2E_UNAVAILABLE', `no end-to-end stream to ${printable(target.resource, 128)} (--e2e require): ${reason}`);
      }
      if (reason !== undefined) this.options.debug?.(`${target.resource}: the classic route (the Proxy sees the stream): ${reason}`);
      const stream = this.options.classic ? await this.options.classic(target) : await openResource(profile, classicAddress, target, dialer, secureContext);
      return { stream, e2e: false, ...(reason !== undefined ? { reason } : {}) };
    };
    if (!this.session) return classic();
    const service = serviceOfTarget(target);
    if (!service) return classic(`this version of gwsh has no end-to-end streams for the route ${printable(target.alpn, 64)}`);
    const outcome = await this.session.request({
      resource: target.resource,
      route: target.alpn,
      ...(target.kind ? { kind: target.kind } : {}),
      ...(target.login ? { login: target.login } : {}),
      // The trace the classic route would carry in its route header (src/trace.ts); the agent gets it from the Proxy.
      ...traceFields(target.trace ?? envTraceContext()),
    });
    if (outcome.kind === 'classic') return classic(outcome.reason);
    const connected = await connectE2E(profile, dialer, this.options.e2eAddress, outcome.grant, service, { ...this.options.connect, ...(this.e2eContext ? { secureContext: this.e2eContext } : {}) });
    if (!connected.ok) return classic(connected.reason);
    this.options.debug?.(`${target.resource}: end-to-end to agent ${outcome.grant.agent}`);
    return { stream: connected.stream, e2e: true, agent: outcome.grant.agent };
  }

  close(): void {
    this.session?.close();
  }
}
