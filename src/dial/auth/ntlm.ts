/**
 * NTLM (NTLMv2 only) as a proxy authentication scheme: the connection-oriented handshake of MS-NLMP on one kept-alive
 * connection, answering a 407 that offers NTLM. The messages are ntlmv2.ts's pure functions; this file is the
 * steps:
 *
 *   407 "NTLM"            -> Type 1 (negotiate), nothing secret in it
 *   407 "NTLM <Type 2>"   -> Type 3 (authenticate), the NTLMv2 response computed from the URL's password
 *   407 again             -> nothing: the proxy refused the credentials (GW_ERR_DIAL_PROXY_AUTH_REFUSED)
 *
 * The credentials are the proxy URL's: http://DOMAIN%5Cuser:password@host:port (ntlmCredentials). The handshake
 * authenticates the connection, not the request (connectionBound): when the proxy closes it between Type 1 and
 * Type 3 the handshake (auth/handshake.ts) starts a new session on a new connection from Type 1. A proxy that
 * answers 200 to Type 1 opens the tunnel (the handshake takes any 2xx).
 */
import type { ProxySpec } from '../select.js';
import { base64Token, type Challenge } from './challenge.js';
import type { AuthSession, ProxyAuthScheme } from './types.js';
import { encodeAuthenticate, encodeNegotiate, MAX_CHALLENGE_BYTES, ntlmCredentials, parseChallenge, type AuthenticateOptions } from './ntlmv2.js';
import { GatewayError } from '../../errors.js';

/** A Type 2 message of MAX_CHALLENGE_BYTES in base64. */
const MAX_TOKEN_LENGTH = Math.ceil(MAX_CHALLENGE_BYTES / 3) * 4;

function badChallenge(what: string): GatewayError {
  return new GatewayError('GW_ERR_DIAL_PROXY_NTLM_CHALLENGE', `the proxy's NTLM challenge is not valid: ${what}`);
}

/** One handshake: Type 1, then Type 3 for the proxy's challenge, then nothing (a second answer is never computed). */
export function ntlmSession(proxy: ProxySpec, o: AuthenticateOptions = {}): AuthSession {
  const credentials = ntlmCredentials(proxy.username ?? '', proxy.password ?? '');
  let state: 'new' | 'negotiated' | 'answered' = 'new';
  return {
    async respond(challenges: readonly Challenge[]) {
      if (state === 'answered') return undefined;
      if (state === 'new') {
        state = 'negotiated';
        return `NTLM ${encodeNegotiate().toString('base64')}`;
      }
      const c = challenges[0];
      const token = c === undefined ? undefined : base64Token(c, MAX_TOKEN_LENGTH);
      // A bare "NTLM" after Type 1: the proxy started over rather than challenge; it is not answered twice.
      if (token === undefined) return undefined;
      if (token === null) throw badChallenge('not an NTLM challenge token (base64, bounded in size)');
      state = 'answered';
      return `NTLM ${encodeAuthenticate(parseChallenge(Buffer.from(token, 'base64')), credentials, o).toString('base64')}`;
    },
  };
}

export const ntlmScheme: ProxyAuthScheme = {
  name: 'NTLM',
  strength: 30,
  connectionBound: true,
  preemptive: false,
  can: (proxy: ProxySpec) => {
    if (proxy.username === undefined) return { ok: false, why: 'needs DOMAIN%5Cuser:password in the proxy URL' };
    try {
      const c = ntlmCredentials(proxy.username, proxy.password ?? '');
      return { ok: true, why: `NTLMv2 as ${c.domain ? `${c.domain}\\` : ''}${c.user} from the proxy URL${c.domain ? '' : " (no domain: the proxy's own)"}` };
    } catch (err) {
      return { ok: false, why: (err as Error).message };
    }
  },
  accepts: (c: Challenge) => c.token68 !== undefined || c.params.size === 0,
  start: (proxy: ProxySpec) => ntlmSession(proxy),
};
