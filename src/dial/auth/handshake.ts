/**
 * The CONNECT handshake with proxy authentication: send CONNECT, and while the proxy answers 407, answer its
 * challenges with the scheme scheme.ts chooses, on the same connection when the proxy keeps it alive, on a new one
 * when it closes it (curl's trap: a 407 with Connection: close; and once, a kept-alive connection closed silently
 * after its 407). NTLM and Negotiate authenticate one connection: when it closes midway they start over from their
 * first message on a new one, MAX_RESTARTS times. Rules it keeps (docs/dialing.md):
 *  - nothing secret before the proxy asks, except Basic to a proxy that asked for Basic on an earlier dial;
 *  - the scheme chosen on the first 407 stays for the whole dial: never a weaker one later, even when a later 407
 *    offers only a weaker one (a lying proxy fishing for a password in clear);
 *  - at most MAX_AUTH_ROUNDS answers to 407s, then GW_ERR_DIAL_PROXY_AUTH_LOOP;
 *  - any 2xx opens the tunnel, even in the middle of a multi-step scheme;
 *  - logs carry scheme names only, never a Proxy-Authorization value or a password.
 * The I/O (connections, the exchange of one CONNECT) is the Dialer's, given as ProxyIo.
 */
import type net from 'node:net';
import { GatewayError, type ErrorCode } from '../../errors.js';
import type { Logger } from '../../log.js';
import { headerValue, type ConnectResponse } from '../connect.js';
import type { ProxySpec } from '../select.js';
import { offeredSchemes, parseChallenges, type Challenge } from './challenge.js';
import { chooseScheme, PROXY_AUTH_SCHEMES } from './scheme.js';
import type { AuthRequest, AuthSession, ProxyAuthScheme } from './types.js';

/** How many 407s one dial answers before it gives up: Digest with a stale nonce needs 2, NTLM 2, Negotiate 1-2. */
export const MAX_AUTH_ROUNDS = 4;

export interface ProxyAnswer {
  response: ConnectResponse;
  /** False when the proxy will close the connection (Connection: close, HTTP/1.0, a body without a length). */
  reusable: boolean;
}

export interface ProxyIo {
  /** A new connection to the proxy (TCP, and TLS for an https:// proxy). */
  open(): Promise<net.Socket>;
  /** Sends CONNECT with this Proxy-Authorization (if any) and reads the answer; on a 2xx the tunnel is ready. */
  exchange(socket: net.Socket, authorization: string | undefined): Promise<ProxyAnswer>;
  /** The error for an answer that is neither 2xx nor 407. */
  refusal(response: ConnectResponse): GatewayError;
}

export interface HandshakeContext {
  proxy: ProxySpec;
  request: AuthRequest;
  /** "proxy http://alice:***@squid:3128 (from HTTPS_PROXY)", for messages. */
  context: string;
  details: Record<string, unknown>;
  log: Logger;
  schemes?: readonly ProxyAuthScheme[];
  /** The scheme this proxy asked for on an earlier dial (only a preemptive one is used before a challenge). */
  remembered?: ProxyAuthScheme;
}

interface Active {
  scheme: ProxyAuthScheme;
  session: AuthSession;
  /** Messages of this scheme sent on the current connection (NTLM's steps must share one). */
  sentHere: number;
  /** Started before any challenge, from what the proxy asked for on an earlier dial. */
  preemptive: boolean;
}

/** The state of one dial: its current connection, and the scheme answering (if any) with its next answer. */
interface Dial {
  socket: net.Socket;
  /** Answers read on this connection (0: a new one). */
  exchanges: number;
  active?: Active;
  authorization?: string;
  /** Times a connection-bound scheme started over on a new connection (at most MAX_RESTARTS). */
  restarts: number;
  /** Whether the one re-dial after a silent close was spent. */
  redialed: boolean;
}

/**
 * How many times a connection-bound scheme (NTLM, Negotiate) starts over from its first message on a new connection
 * when the proxy closes the one its handshake was on; then GW_ERR_DIAL_PROXY_AUTH_REFUSED.
 */
export const MAX_RESTARTS = 1;

/** Runs the handshake; resolves with the connection that carries the tunnel, and the scheme that got it (if any). */
export async function connectThroughProxy(io: ProxyIo, hc: HandshakeContext): Promise<{ socket: net.Socket; scheme?: ProxyAuthScheme }> {
  const d: Dial = { socket: watched(await io.open()), exchanges: 0, restarts: 0, redialed: false };
  try {
    if (hc.remembered?.preemptive && hc.remembered.can(hc.proxy).ok) {
      d.active = { scheme: hc.remembered, session: hc.remembered.start(hc.proxy, hc.request), sentHere: 0, preemptive: true };
      d.authorization = await d.active.session.respond([]);
      hc.log.debug({ proxy: hc.proxy.display, scheme: d.active.scheme.name }, 'answering the proxy pre-emptively, as it asked on an earlier dial');
    }
    for (let round = 0; ; round++) {
      const answer = await exchange(io, hc, d);
      const res = answer.response;
      if (res.statusCode >= 200 && res.statusCode < 300) {
        d.socket.off('error', idleError);
        return { socket: d.socket, ...(d.active ? { scheme: d.active.scheme } : {}) };
      }
      if (res.statusCode !== 407) throw io.refusal(res);
      if (round >= MAX_AUTH_ROUNDS) throw loopError(hc, res, d.active);
      const challenges = challengesOf(res, hc);
      const active = pickScheme(challenges, d.active, hc, res);
      d.active = active;
      d.authorization = await active.session.respond(challenges.filter((c) => c.key === active.scheme.name.toLowerCase()));
      if (d.authorization === undefined) throw refused(hc, res, active.scheme);
      hc.log.debug({ proxy: hc.proxy.display, offered: offeredSchemes(challenges), scheme: active.scheme.name, round: round + 1 }, 'answering the proxy\'s challenge');
      if (!answer.reusable) {
        if (active.scheme.connectionBound && active.sentHere > 0 && d.restarts++ >= MAX_RESTARTS) throw closedMidway(hc, res, active.scheme);
        hc.log.debug({ proxy: hc.proxy.display }, 'the proxy closes the connection after its 407: continuing on a new one');
        await newConnection(io, hc, d);
      }
    }
  } catch (err) {
    d.socket.destroy();
    throw err;
  }
}

/**
 * Between two exchanges nobody else listens on the connection (the scheme may be waiting on a KDC): a reset then
 * would be an unhandled 'error' that ends the process. It only destroys the socket, which the next exchange sees
 * as the proxy having closed it (a re-dial, below).
 */
const idleError = (): void => undefined;
function watched(socket: net.Socket): net.Socket {
  return socket.on('error', idleError);
}

/**
 * Sends the dial's next CONNECT on its connection. curl's trap: a proxy that closes a kept-alive connection right
 * after its 407 without saying so (no Connection: close) gets one re-dial per dial that continues the handshake;
 * the first answer on a new connection failing is the proxy's failure, not a trap.
 */
async function exchange(io: ProxyIo, hc: HandshakeContext, d: Dial): Promise<ProxyAnswer> {
  if (d.active && d.authorization !== undefined) d.active.sentHere++;
  try {
    const answer = await io.exchange(d.socket, d.authorization);
    d.exchanges++;
    return answer;
  } catch (err) {
    if (!(err instanceof GatewayError) || err.code !== 'GW_ERR_DIAL_PROXY_CLOSED' || d.exchanges === 0 || d.redialed) throw err;
    d.redialed = true;
    hc.log.debug({ proxy: hc.proxy.display }, 'the proxy closed the kept-alive connection after its 407 without saying so: once more on a new one');
    await newConnection(io, hc, d);
    return exchange(io, hc, d);
  }
}

/**
 * Moves the dial to a new connection. A connection-bound scheme that sent something on the old one starts a new
 * session from its first message (its steps there are lost with the connection); another scheme sends on the new
 * connection what it was about to send.
 */
async function newConnection(io: ProxyIo, hc: HandshakeContext, d: Dial): Promise<void> {
  d.socket.destroy();
  d.socket = watched(await io.open());
  d.exchanges = 0;
  const active = d.active;
  if (!active) return;
  if (!active.scheme.connectionBound || active.sentHere === 0) {
    active.sentHere = 0;
    return;
  }
  hc.log.debug({ proxy: hc.proxy.display, scheme: active.scheme.name }, 'starting the handshake over on the new connection');
  d.active = { scheme: active.scheme, session: active.scheme.start(hc.proxy, hc.request), sentHere: 0, preemptive: false };
  d.authorization = await d.active.session.respond([]);
}

function challengesOf(res: ConnectResponse, hc: HandshakeContext): Challenge[] {
  const values = res.headers.filter(([n]) => n === 'proxy-authenticate').map(([, v]) => v);
  try {
    return parseChallenges(values);
  } catch (err) {
    throw new GatewayError('GW_ERR_DIAL_PROXY_MALFORMED', `${hc.context} sent a 407 that cannot be read: ${(err as Error).message}`, {
      details: { ...hc.details, status: 407 },
    });
  }
}

/**
 * The scheme for this 407: the first 407 chooses (also after a pre-emptive answer: the proxy may want a stronger
 * scheme now), later ones must keep offering the scheme chosen.
 */
function pickScheme(challenges: Challenge[], active: Active | undefined, hc: HandshakeContext, res: ConnectResponse): Active {
  if (active && !active.preemptive) {
    if (challenges.some((c) => c.key === active.scheme.name.toLowerCase())) return active;
    // Answered a challenge of this scheme, and the proxy now offers something else: never move to another
    // scheme mid-dial (a weaker one would hand a lying proxy what the stronger one protected).
    const offered = offeredSchemes(challenges);
    throw refused(hc, res, active.scheme, ` and then offered ${offered.length > 0 ? offered.join(', ') : 'nothing'} instead`);
  }
  const choice = chooseScheme(challenges, hc.proxy, hc.schemes ?? PROXY_AUTH_SCHEMES);
  if (choice.scheme === undefined) throw noScheme(hc, res, choice);
  if (active) {
    // A pre-emptive answer met a 407: the same scheme again means those credentials were refused (its session
    // has nothing more to say); a stronger one starts afresh; a weaker one is never taken.
    if (choice.scheme === active.scheme) return { ...active, preemptive: false };
    if (choice.scheme.strength < active.scheme.strength) throw refused(hc, res, active.scheme);
  }
  return { scheme: choice.scheme, session: choice.scheme.start(hc.proxy, hc.request), sentHere: 0, preemptive: false };
}

function status(res: ConnectResponse): string {
  return `${res.statusCode}${res.reason ? ` ${res.reason}` : ''}`;
}

function noScheme(hc: HandshakeContext, res: ConnectResponse, choice: { offered: string[]; declined: string[]; code?: ErrorCode }): GatewayError {
  const { offered, declined } = choice;
  const what = offered.length > 0 ? offered.join(', ') : 'no scheme (no Proxy-Authenticate header)';
  const details = { ...hc.details, status: 407, offered };
  const where = `CONNECT ${hc.request.uri}`;
  const why = declined.length > 0 ? ` (${declined.join('; ')})` : '';
  // A scheme that says which error its "cannot" is (Negotiate without its module or without a ticket) names the fix.
  if (choice.code) {
    return new GatewayError(choice.code, `${hc.context} requires authentication for ${where} and offers ${what}, none of which this client can answer${why}`, {
      details,
    });
  }
  if (hc.proxy.username === undefined && offered.length > 0 && declined.length > 0) {
    return new GatewayError('GW_ERR_DIAL_PROXY_AUTH_REQUIRED', `${hc.context} requires authentication for ${where}: ${status(res)}; it offers ${what}`, {
      details,
    });
  }
  return new GatewayError(
    'GW_ERR_DIAL_PROXY_AUTH_UNSUPPORTED',
    `${hc.context} requires authentication for ${where} and offers ${what}, none of which this client can answer${why}`,
    { details },
  );
}

function refused(hc: HandshakeContext, res: ConnectResponse, scheme: ProxyAuthScheme, more = ''): GatewayError {
  return new GatewayError(
    'GW_ERR_DIAL_PROXY_AUTH_REFUSED',
    `${hc.context} refused the ${scheme.name} credentials of user "${hc.proxy.username ?? ''}" for CONNECT ${hc.request.uri}: ${status(res)}${more}`,
    { details: { ...hc.details, status: 407, scheme: scheme.name } },
  );
}

function closedMidway(hc: HandshakeContext, res: ConnectResponse, scheme: ProxyAuthScheme): GatewayError {
  return new GatewayError(
    'GW_ERR_DIAL_PROXY_AUTH_REFUSED',
    `${hc.context} closed the connection in the middle of the ${scheme.name} handshake for CONNECT ${hc.request.uri} (${status(res)}), ` +
      `which must stay on one connection`,
    { details: { ...hc.details, status: 407, scheme: scheme.name } },
  );
}

function loopError(hc: HandshakeContext, res: ConnectResponse, active: Active | undefined): GatewayError {
  const asks = headerValue(res, 'proxy-authenticate')?.split(/[\s,]/)[0];
  return new GatewayError(
    'GW_ERR_DIAL_PROXY_AUTH_LOOP',
    `${hc.context} still answered ${status(res)} to CONNECT ${hc.request.uri} after ${MAX_AUTH_ROUNDS} answers` +
      `${active ? ` with ${active.scheme.name}` : ''}${asks ? ` (it keeps asking for ${asks})` : ''}`,
    { details: { ...hc.details, status: 407, rounds: MAX_AUTH_ROUNDS } },
  );
}
