/**
 * Every request of the Auth Service to an identity provider goes through the process's Dialer (HTTPS_PROXY /
 * NO_PROXY rules, the same errors as every dial): a Fetch-API-shaped function on fetchThroughDialer, which
 * openid-client takes as its customFetch, and which the SAML metadata and the code-hosting API use too. Bounded:
 * a deadline per request and a cap on the answer's size. A connector's `ca` is trusted besides the system's roots.
 */
import { rootCertificates } from 'node:tls';
import { fetchThroughDialer } from '../../dial/agent.js';
import type { Dialer } from '../../dial/dialer.js';
import { GatewayError, isGatewayError } from '../../errors.js';

/** An identity provider's answer is a few kilobytes; metadata with many certificates some more. */
const MAX_ANSWER = 1024 * 1024;
const TIMEOUT_MS = 15_000;

export type IdpFetch = (url: string, init?: { method?: string; headers?: Record<string, string>; body?: unknown; signal?: AbortSignal | null }) => Promise<Response>;

function bodyOf(body: unknown): string | Buffer | undefined {
  if (body === undefined || body === null) return undefined;
  if (typeof body === 'string' || Buffer.isBuffer(body)) return body;
  if (body instanceof URLSearchParams) return body.toString();
  if (body instanceof Uint8Array) return Buffer.from(body);
  throw new GatewayError('GW_ERR_INTERNAL', 'unsupported request body for an identity provider');
}

/** The provider could not be reached (or answered garbage): GW_ERR_SSO_IDP_ERROR naming it and the cause. */
export function unreachable(url: string, err: unknown): GatewayError {
  const cause = isGatewayError(err) ? `${err.message} (${err.code})` : (err as Error).message;
  return new GatewayError('GW_ERR_SSO_IDP_ERROR', `the identity provider at ${new URL(url).origin} could not be reached: ${cause}`, {
    hint: 'Check that the identity provider is up and that the Auth Service reaches it (HTTPS_PROXY / NO_PROXY of the Auth Service, firewall); a private CA goes in the connector\'s `ca`.',
    cause: err,
  });
}

export function idpFetch(dialer: Dialer, ca: string | undefined): IdpFetch {
  const trusted = ca ? [...rootCertificates, ca] : undefined;
  return async (url, init = {}) => {
    const headers: Record<string, string> = { ...(init.headers ?? {}) };
    const body = bodyOf(init.body);
    let answer;
    try {
      answer = await fetchThroughDialer(url, {
        dialer,
        method: init.method ?? 'GET',
        headers,
        ...(body === undefined ? {} : { body }),
        ...(trusted ? { ca: trusted } : {}),
        ...(init.signal ? { signal: init.signal } : {}),
        timeoutMs: TIMEOUT_MS,
        maxBodyBytes: MAX_ANSWER,
        tlsPeer: { server: 'server', untrustedHint: "Give the identity provider's CA certificate in the connector's `ca` field (PEM), or fix the provider's certificate chain." },
      });
    } catch (err) {
      throw unreachable(url, err);
    }
    const out = new Headers();
    for (const [name, value] of Object.entries(answer.headers)) {
      if (value === undefined) continue;
      for (const v of Array.isArray(value) ? value : [value]) out.append(name, v);
    }
    const empty = answer.status === 204 || answer.status === 304;
    return new Response(empty ? null : new Uint8Array(answer.body), { status: answer.status, headers: out });
  };
}

/** GET url as JSON through the Dialer; an HTTP error status or a body that is not JSON is GW_ERR_SSO_IDP_ERROR. */
export async function getJson(fetch: IdpFetch, url: string, headers: Record<string, string>): Promise<unknown> {
  const res = await fetch(url, { headers: { accept: 'application/json', ...headers } });
  const text = await res.text();
  if (res.status !== 200) throw idpAnswered(url, `HTTP ${res.status}: ${text.slice(0, 200)}`);
  try {
    return JSON.parse(text) as unknown;
  } catch {
    throw idpAnswered(url, 'an answer that is not JSON');
  }
}

export function idpAnswered(url: string, what: string): GatewayError {
  return new GatewayError('GW_ERR_SSO_IDP_ERROR', `the identity provider at ${new URL(url).origin} answered ${what}`, {
    hint: "Check the connector's client ID and secret and the provider's logs; sign in again.",
  });
}

/** GET url as text through the Dialer (SAML metadata); an HTTP error status is GW_ERR_SSO_IDP_ERROR. */
export async function getText(fetch: IdpFetch, url: string): Promise<string> {
  const res = await fetch(url, { headers: { accept: 'application/xml, text/xml, */*' } });
  const text = await res.text();
  if (res.status !== 200) throw idpAnswered(url, `HTTP ${res.status}`);
  return text;
}
