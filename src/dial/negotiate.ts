/**
 * Negotiate (SPNEGO over Kerberos) proxy authentication: the token steps of a GSSAPI security context for the
 * proxy's service principal HTTP@<proxy host>, behind ConnectionAuthScheme (connauth.ts). No Kerberos is written
 * here: the tokens come from the system's GSSAPI (MIT libkrb5 on Debian) through the `kerberos` npm package
 * (mongodb-js), which is an optional native module: it is loaded on first use, and an installation without it
 * gets GW_ERR_DIAL_PROXY_NEGOTIATE_UNAVAILABLE naming what to install, never a crash at start-up.
 *
 * The credentials are the process's own, as GSSAPI finds them: the credential cache of KRB5CCNAME (kinit), or a
 * client keytab in KRB5_CLIENT_KTNAME from which libkrb5 gets and renews tickets by itself (an agent running as a
 * service); the realm's configuration from KRB5_CONFIG or /etc/krb5.conf. The proxy host is used as written in
 * the proxy URL (whether libkrb5 canonicalises it through DNS is krb5.conf's dns_canonicalize_hostname).
 *
 * Decisions:
 * - The mechanism is SPNEGO (RFC 4559's Negotiate), not raw Kerberos: what browsers and curl send, and what
 *   squid's negotiate_kerberos_auth and Windows proxies expect.
 * - GSSAPI's failures (no ticket, an expired one, an unknown principal, an unreachable KDC) become
 *   GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED carrying GSSAPI's own text, which names principals, never keys.
 * - A bare `Negotiate` in a 407 after the token was sent is the proxy refusing it: GW_ERR_DIAL_PROXY_AUTH_REFUSED,
 *   no further attempt. Continuation tokens are answered at most MAX_ROUNDS times in all (a proxy that keeps
 *   challenging is a loop, not a handshake).
 */
import { createRequire } from 'node:module';
import { GatewayError } from '../errors.js';
import { schemeToken, type ConnectionAuthScheme } from './connauth.js';

/** The part of the `kerberos` package's API used here. */
export interface GssapiClient {
  step(challenge: string): Promise<string>;
  contextComplete: boolean;
}
export interface GssapiBinding {
  initializeClient(service: string, options?: { mechOID?: number; gssFlag?: number }): Promise<GssapiClient>;
  GSS_MECH_OID_SPNEGO: number;
  GSS_C_MUTUAL_FLAG: number;
  GSS_C_SEQUENCE_FLAG: number;
}

export const MAX_ROUNDS = 4;
/** Bound on a token from the proxy (base64 characters); Kerberos tokens with a PAC stay well under it. */
export const MAX_TOKEN_LENGTH = 64 * 1024;

/** The `kerberos` package (or the module at `from`), or GW_ERR_DIAL_PROXY_NEGOTIATE_UNAVAILABLE. */
export function loadGssapi(from = 'kerberos'): GssapiBinding {
  try {
    const binding = createRequire(import.meta.url)(from) as GssapiBinding;
    if (typeof binding.initializeClient !== 'function') throw new Error(`${from} has no initializeClient`);
    return binding;
  } catch (err) {
    throw new GatewayError(
      'GW_ERR_DIAL_PROXY_NEGOTIATE_UNAVAILABLE',
      `the proxy asks for Negotiate (Kerberos), but the GSSAPI binding cannot be loaded: ${(err as Error).message.split('\n')[0]}`,
      { cause: err },
    );
  }
}

function failed(proxyHost: string, err: unknown): GatewayError {
  return new GatewayError(
    'GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED',
    `no Kerberos token for the proxy's service principal HTTP@${proxyHost}: ${(err as Error).message ?? String(err)}`,
    { cause: err },
  );
}

/** The Negotiate scheme for one connection to the proxy at `proxyHost`. */
export function negotiateScheme(proxyHost: string, binding?: GssapiBinding): ConnectionAuthScheme {
  let client: GssapiClient | undefined;
  let rounds = 0;
  const step = async (token: string): Promise<string> => {
    if (++rounds > MAX_ROUNDS) {
      throw new GatewayError('GW_ERR_DIAL_PROXY_AUTH_REFUSED', `the proxy asked for more than ${MAX_ROUNDS} Negotiate tokens on one connection`);
    }
    try {
      if (!client) {
        const gss = binding ?? loadGssapi();
        client = await gss.initializeClient(`HTTP@${proxyHost}`, { mechOID: gss.GSS_MECH_OID_SPNEGO, gssFlag: gss.GSS_C_MUTUAL_FLAG | gss.GSS_C_SEQUENCE_FLAG });
      }
      const out = await client.step(token);
      if (!out) throw new Error('GSSAPI produced no token');
      return `Negotiate ${out}`;
    } catch (err) {
      throw err instanceof GatewayError ? err : failed(proxyHost, err);
    }
  };
  return {
    name: 'Negotiate',
    first: () => step(''),
    async next(challenge: string) {
      const token = schemeToken(challenge, 'Negotiate', MAX_TOKEN_LENGTH);
      if (rounds === 0) throw failed(proxyHost, new Error('a challenge before the first token was sent'));
      if (token === undefined) {
        throw new GatewayError('GW_ERR_DIAL_PROXY_AUTH_REFUSED', `the proxy refused the Kerberos ticket for HTTP@${proxyHost} (407 after the Negotiate token)`);
      }
      if (token === null) throw failed(proxyHost, new Error('the proxy sent a Negotiate token that is not base64 or is too long'));
      return step(token);
    },
  };
}
