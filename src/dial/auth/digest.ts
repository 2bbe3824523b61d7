/**
 * Digest (RFC 7616) for CONNECT: algorithms MD5, SHA-256 and SHA-512-256 and their -sess forms, qop=auth with
 * nc and cnonce, the RFC 2069 form when the proxy gives no qop, userhash, and one retry on stale=true. The
 * computation is a few hashes (node:crypto), small enough to write here rather than take a library for. Of
 * several Digest challenges the strongest algorithm wins (SHA-512-256 > SHA-256 > MD5). qop=auth-int is not
 * answered (a CONNECT has no body, but no proxy offers auth-int alone); a challenge this file cannot answer is
 * declined by accepts(), so the Dialer reports it instead of guessing.
 */
import { createHash, randomBytes } from 'node:crypto';
import type { ProxySpec } from '../select.js';
import type { Challenge } from './challenge.js';
import type { AuthRequest, AuthSession, ProxyAuthScheme } from './types.js';

/** Digest algorithms this client answers, by name (uppercase), with node's hash name and their rank. */
const ALGORITHMS: ReadonlyMap<string, { hash: string; rank: number }> = new Map([
  ['MD5', { hash: 'md5', rank: 1 }],
  ['SHA-256', { hash: 'sha256', rank: 2 }],
  ['SHA-512-256', { hash: 'sha512-256', rank: 3 }],
]);

interface Algorithm {
  /** As the challenge wrote it, or undefined when it gave none (MD5). */
  written: string | undefined;
  hash: string;
  sess: boolean;
  rank: number;
}

function algorithmOf(c: Challenge): Algorithm | undefined {
  const written = c.params.get('algorithm');
  const upper = (written ?? 'MD5').toUpperCase();
  const sess = upper.endsWith('-SESS');
  const known = ALGORITHMS.get(sess ? upper.slice(0, -'-SESS'.length) : upper);
  return known && { written, hash: known.hash, sess, rank: known.rank };
}

function qopsOf(c: Challenge): string[] | undefined {
  const qop = c.params.get('qop');
  return qop === undefined ? undefined : qop.split(',').map((q) => q.trim().toLowerCase());
}

function acceptsDigest(c: Challenge): boolean {
  const qops = qopsOf(c);
  return c.params.has('realm') && c.params.has('nonce') && algorithmOf(c) !== undefined && (qops === undefined || qops.includes('auth'));
}

/** A quoted-string (RFC 9110 section 5.6.4). */
function quote(value: string): string {
  return `"${value.replace(/[\\"]/g, (c) => `\\${c}`)}"`;
}

export interface DigestInput {
  username: string;
  password: string;
  method: string;
  uri: string;
  challenge: Challenge;
  /** The nonce count of this answer (1 for the first answer to a nonce). */
  nc: number;
  cnonce: string;
}

/** The Proxy-Authorization value for one challenge (RFC 7616 section 3.4). Pure, so it is tested against the RFC's examples. */
export function digestResponse(input: DigestInput): string {
  const { challenge: c, username, password, method, uri } = input;
  const alg = algorithmOf(c);
  if (!alg) throw new Error(`unsupported Digest algorithm ${c.params.get('algorithm')}`);
  const H = (s: string) => createHash(alg.hash).update(s, 'utf8').digest('hex');
  const realm = c.params.get('realm') ?? '';
  const nonce = c.params.get('nonce') ?? '';
  const qop = qopsOf(c) === undefined ? undefined : 'auth';
  const nc = input.nc.toString(16).padStart(8, '0');
  let ha1 = H(`${username}:${realm}:${password}`);
  if (alg.sess) ha1 = H(`${ha1}:${nonce}:${input.cnonce}`);
  const ha2 = H(`${method}:${uri}`);
  const response = qop === undefined ? H(`${ha1}:${nonce}:${ha2}`) : H(`${ha1}:${nonce}:${nc}:${input.cnonce}:${qop}:${ha2}`);
  const userhash = c.params.get('userhash')?.toLowerCase() === 'true';
  const parts: string[] = [];
  if (userhash) parts.push(`username=${quote(H(`${username}:${realm}`))}`);
  // eslint-disable-next-line no-control-regex
  else if (/^[\x20-\x7e]*$/.test(username)) parts.push(`username=${quote(username)}`);
  else parts.push(`username*=UTF-8''${encodeURIComponent(username)}`);
  parts.push(`realm=${quote(realm)}`, `uri=${quote(uri)}`);
  if (alg.written !== undefined) parts.push(`algorithm=${alg.written}`);
  parts.push(`nonce=${quote(nonce)}`);
  if (qop !== undefined) parts.push(`nc=${nc}`, `cnonce=${quote(input.cnonce)}`, `qop=${qop}`);
  parts.push(`response=${quote(response)}`);
  if (c.params.has('opaque')) parts.push(`opaque=${quote(c.params.get('opaque')!)}`);
  if (userhash) parts.push('userhash=true');
  return `Digest ${parts.join(', ')}`;
}

/** The challenge to answer among several: the strongest algorithm, the first of equals. */
function strongest(challenges: readonly Challenge[]): Challenge | undefined {
  let best: Challenge | undefined;
  for (const c of challenges) {
    if (!acceptsDigest(c)) continue;
    if (best === undefined || algorithmOf(c)!.rank > algorithmOf(best)!.rank) best = c;
  }
  return best;
}

export const digestScheme: ProxyAuthScheme = {
  name: 'Digest',
  strength: 20,
  connectionBound: false,
  preemptive: false,
  can: (proxy: ProxySpec) =>
    proxy.username === undefined
      ? { ok: false, why: 'needs user:password in the proxy URL' }
      : { ok: true, why: `user "${proxy.username}" from the proxy URL; MD5, SHA-256, SHA-512-256, qop=auth` },
  accepts: acceptsDigest,
  start(proxy: ProxySpec, request: AuthRequest): AuthSession {
    let answered = 0;
    return {
      async respond(challenges) {
        const c = strongest(challenges);
        if (c === undefined) return undefined;
        // A second 407 is a refusal, unless the proxy says only the nonce was stale (RFC 7616 section 3.3): then
        // one more answer with the new nonce, and no more.
        const stale = c.params.get('stale')?.toLowerCase() === 'true';
        if (answered >= 2 || (answered === 1 && !stale)) return undefined;
        answered++;
        return digestResponse({
          username: proxy.username ?? '',
          password: proxy.password ?? '',
          method: request.method,
          uri: request.uri,
          challenge: c,
          nc: 1,
          cnonce: randomBytes(16).toString('hex'),
        });
      },
    };
  },
};
