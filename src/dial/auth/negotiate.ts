/**
 * Negotiate (SPNEGO over Kerberos, RFC 4559) as a proxy authentication scheme: the token steps of a GSSAPI security
 * context for the proxy's service principal HTTP@<proxy host>, answering a 407 that offers Negotiate. No Kerberos
 * is written here: the tokens come from the system's GSSAPI (MIT libkrb5 on Debian) through the `kerberos` npm
 * package (mongodb-js), an optional native module: it is loaded on first use, and an installation without it gets
 * GW_ERR_DIAL_PROXY_NEGOTIATE_UNAVAILABLE naming what to install, never a crash at start-up (the bundle keeps it
 * external: scripts/bundle.mjs).
 *
 * The credentials are the process's own, as GSSAPI finds them, never the proxy URL's: the credential cache of
 * KRB5CCNAME (kinit), or a client keytab in KRB5_CLIENT_KTNAME from which libkrb5 gets and renews tickets by itself
 * (an agent running as a service); the realm's configuration from KRB5_CONFIG or /etc/krb5.conf. `can` looks at
 * those variables (GSSAPI reads the process's environment, so this does too) to tell `gateway dial-plan` what
 * would be used, or why Negotiate cannot be. The proxy host is used as written in the proxy URL (whether libkrb5
 * canonicalises it through DNS is krb5.conf's dns_canonicalize_hostname).
 *
 * Decisions:
 * - The mechanism is SPNEGO, not raw Kerberos: what browsers and curl send, and what squid's
 *   negotiate_kerberos_auth and Windows proxies expect.
 * - GSSAPI's failures (no ticket, an expired one, an unknown principal, an unreachable KDC) become
 *   GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED carrying GSSAPI's own text, which names principals, never keys.
 * - A bare `Negotiate` in a 407 after the token was sent is the proxy refusing it: the session has nothing more to
 *   say (GW_ERR_DIAL_PROXY_AUTH_REFUSED from the handshake). Continuation tokens are answered at most MAX_ROUNDS
 *   times in all (a proxy that keeps challenging is a loop, not a handshake).
 */
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { GatewayError } from '../../errors.js';
import type { ProxySpec } from '../select.js';
import { base64Token, type Challenge } from './challenge.js';
import type { AuthAbility, AuthSession, ProxyAuthScheme } from './types.js';

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
/**
 * How long one GSSAPI step may take (getting a ticket from a KDC that does not answer): libkrb5's own retries across
 * a realm's KDCs can run far longer, and the dial must not wait past its deadlines. The native call is left to end
 * in its thread; the dial stops waiting for it.
 */
export const GSSAPI_STEP_TIMEOUT_MS = 15_000;
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

/** The promise, or an error once `ms` have passed (GSSAPI's calls take no deadline of their own). */
function bounded<T>(p: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`GSSAPI did not answer within ${ms} ms (is the realm's KDC reachable from here?)`)), ms);
  });
  return Promise.race([p, late]).finally(() => clearTimeout(timer));
}

/** One handshake with the proxy at `proxyHost`: a fresh GSSAPI context, its first token, then the proxy's tokens answered. */
export function negotiateSession(proxyHost: string, gss: () => GssapiBinding, stepTimeoutMs = GSSAPI_STEP_TIMEOUT_MS): AuthSession {
  let client: GssapiClient | undefined;
  let rounds = 0;
  const step = async (token: string): Promise<string> => {
    try {
      if (!client) {
        const b = gss();
        client = await bounded(b.initializeClient(`HTTP@${proxyHost}`, { mechOID: b.GSS_MECH_OID_SPNEGO, gssFlag: b.GSS_C_MUTUAL_FLAG | b.GSS_C_SEQUENCE_FLAG }), stepTimeoutMs);
      }
      const out = await bounded(client.step(token), stepTimeoutMs);
      if (!out) throw new Error('GSSAPI produced no token');
      return `Negotiate ${out}`;
    } catch (err) {
      throw err instanceof GatewayError ? err : failed(proxyHost, err);
    }
  };
  return {
    async respond(challenges: readonly Challenge[]) {
      if (rounds >= MAX_ROUNDS) return undefined;
      const c = challenges[0];
      if (rounds++ === 0) return step('');
      const token = c === undefined ? undefined : base64Token(c, MAX_TOKEN_LENGTH);
      if (token === undefined) return undefined; // a bare Negotiate after our token: refused
      if (token === null) throw failed(proxyHost, new Error('the proxy sent a Negotiate token that is not base64 or is too long'));
      return step(token);
    },
  };
}

/** Where GSSAPI will take the client's credentials from, per the environment, or why there are none. */
export function kerberosCredentials(env: Record<string, string | undefined>, uid = process.getuid?.() ?? 0): AuthAbility {
  const keytab = env.KRB5_CLIENT_KTNAME;
  const cache = env.KRB5CCNAME;
  const fileOf = (name: string) => (name.startsWith('FILE:') ? name.slice(5) : name.includes(':') ? undefined : name);
  if (keytab !== undefined && keytab !== '') {
    const path = fileOf(keytab);
    if (path !== undefined && !existsSync(path)) return { ok: false, why: `KRB5_CLIENT_KTNAME names ${path}, which does not exist` };
    return { ok: true, why: `tickets from the client keytab KRB5_CLIENT_KTNAME=${keytab}${cache ? `, cached in KRB5CCNAME=${cache}` : ''}` };
  }
  if (cache !== undefined && cache !== '') {
    const path = fileOf(cache);
    if (path !== undefined && !existsSync(path)) return { ok: false, why: `no Kerberos credentials: KRB5CCNAME names ${path}, which does not exist (run kinit, or set KRB5_CLIENT_KTNAME to a keytab)` };
    return { ok: true, why: `the ticket in KRB5CCNAME=${cache}` };
  }
  const fallback = `/tmp/krb5cc_${uid}`;
  if (existsSync(fallback)) return { ok: true, why: `the ticket in the default credential cache ${fallback}` };
  return { ok: false, why: `no Kerberos credentials: KRB5CCNAME and KRB5_CLIENT_KTNAME are unset and there is no ${fallback} (run kinit, or set KRB5_CLIENT_KTNAME to a keytab)` };
}

export interface NegotiateOptions {
  /** The GSSAPI binding, or the module to load it from (default: the `kerberos` package, loaded on first use). */
  binding?: GssapiBinding | string;
  /** The environment GSSAPI reads (default: the process's). */
  env?: Record<string, string | undefined>;
  /** Bound on one GSSAPI step (GSSAPI_STEP_TIMEOUT_MS by default). */
  stepTimeoutMs?: number;
}

/** The Negotiate scheme; PROXY_AUTH_SCHEMES holds the default one. */
export function makeNegotiateScheme(o: NegotiateOptions = {}): ProxyAuthScheme {
  let loaded: GssapiBinding | GatewayError | undefined = typeof o.binding === 'object' ? o.binding : undefined;
  const gss = (): GssapiBinding => {
    if (loaded === undefined) {
      try {
        loaded = loadGssapi(typeof o.binding === 'string' ? o.binding : undefined);
      } catch (err) {
        loaded = err as GatewayError;
      }
    }
    if (loaded instanceof GatewayError) throw loaded;
    return loaded;
  };
  return {
    name: 'Negotiate',
    strength: 40,
    connectionBound: true,
    preemptive: false,
    can: (proxy: ProxySpec) => {
      // The credentials first: without them the module does not matter, and what to do first is kinit.
      const creds = kerberosCredentials(o.env ?? process.env);
      if (!creds.ok) return { ok: false, code: 'GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED', why: creds.why };
      try {
        gss();
      } catch (err) {
        return {
          ok: false,
          code: 'GW_ERR_DIAL_PROXY_NEGOTIATE_UNAVAILABLE',
          why: `the kerberos module cannot be loaded (${(err as Error).message.replace(/^.*cannot be loaded: /, '')}): apt-get install libkrb5-dev, then reinstall the gateway`,
        };
      }
      return { ok: true, why: `Kerberos (SPNEGO) for HTTP@${proxy.host} with ${creds.why}` };
    },
    accepts: (c: Challenge) => c.token68 !== undefined || c.params.size === 0,
    start: (proxy: ProxySpec) => negotiateSession(proxy.host, gss, o.stepTimeoutMs),
  };
}

export const negotiateScheme: ProxyAuthScheme = makeNegotiateScheme();
