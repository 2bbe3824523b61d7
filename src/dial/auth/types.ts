/**
 * What a proxy authentication scheme is to the Dialer: a name, a strength, whether this client can do it for a
 * proxy URL (can), which challenges it can answer (accepts), and a session that turns the proxy's challenges into
 * Proxy-Authorization values, step by step. One file per scheme implements it (basic.ts, digest.ts, ntlm.ts,
 * negotiate.ts); scheme.ts lists them and chooses.
 */
import type { ErrorCode } from '../../errors.js';
import type { ProxySpec } from '../select.js';
import type { Challenge } from './challenge.js';

/** The request being authorized: the answer of some schemes (Digest) covers it. */
export interface AuthRequest {
  method: 'CONNECT';
  /** The request target: for CONNECT, the authority host:port. */
  uri: string;
}

/**
 * Can this client answer the scheme for this proxy, and why (or why not): `gateway dial-plan` prints `why`. A
 * `code` names the error a dial fails with when the proxy offers nothing else this client can answer (Negotiate
 * without its module: GW_ERR_DIAL_PROXY_NEGOTIATE_UNAVAILABLE), instead of the generic "no scheme".
 */
export type AuthAbility = { ok: true; why: string } | { ok: false; why: string; code?: ErrorCode };

/** One handshake of one scheme, for one CONNECT (across the connections it may take). */
export interface AuthSession {
  /**
   * The next Proxy-Authorization value, given this scheme's challenges in the proxy's latest 407 (empty for a
   * pre-emptive first message, or a connection-bound scheme's first message on a new connection), or undefined when
   * the scheme has nothing more to say: the proxy refused what was sent. Never logs what it returns.
   */
  respond(challenges: readonly Challenge[]): Promise<string | undefined>;
}

export interface ProxyAuthScheme {
  /** As sent in Proxy-Authorization ("Digest"); challenges match it case-insensitively. */
  readonly name: string;
  /** Higher is stronger: Negotiate 40 > NTLM 30 > Digest 20 > Basic 10. */
  readonly strength: number;
  /**
   * The steps must share one kept-alive connection (NTLM and Negotiate authenticate the connection, not the
   * request): when the connection closes in the middle of the handshake, a new session starts from its first
   * message on a new connection (bounded), where other schemes re-dial and continue.
   */
  readonly connectionBound: boolean;
  /** May be sent before any challenge, to a proxy that asked for this scheme on an earlier dial (Basic). */
  readonly preemptive: boolean;
  can(proxy: ProxySpec): AuthAbility;
  /** Whether this client can answer this one challenge (Digest: a known algorithm, qop auth or none). */
  accepts(challenge: Challenge): boolean;
  start(proxy: ProxySpec, request: AuthRequest): AuthSession;
}
