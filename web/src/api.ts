/**
 * The page's API client: JSON over fetch to the Proxy it was loaded from. Every call carries the session's
 * bearer (Authorization: Bearer), the cookie rides along by itself (same origin, SameSite=Strict). A failure is
 * an ApiError with the server's code, message and hint; a 401 that says the session is gone sends the page back
 * to the sign-in page (with "your session expired" when it expired).
 */
import { BearerStore } from './lib/bearer.js';
import { ApiError, failureFrom, signInReason, unreachable } from './lib/errors.js';
import type { Agents, AuditRow, Connector, CurrentSession, Ping, Resources, RolloutStatus, SessionCreated, TokenCreated, TokenRow } from './types.js';

function sessionStore(): Storage | undefined {
  try {
    return window.sessionStorage;
  } catch {
    return undefined;
  }
}

export const bearer = new BearerStore(sessionStore());

type Listener = (reason: 'expired' | 'signed-out') => void;
let onSignedOut: Listener = () => undefined;

/** Who is told when the server says the session is gone (the app: back to the sign-in page). */
export function whenSignedOut(listener: Listener): void {
  onSignedOut = listener;
}

/** A request to a JSON route. auth false: no bearer (sign-in, ping, connectors). */
export async function call<T>(method: string, path: string, body?: unknown, options: { auth?: boolean; signal?: AbortSignal } = {}): Promise<T> {
  const headers: Record<string, string> = { accept: 'application/json' };
  if (body !== undefined) headers['content-type'] = 'application/json';
  const token = options.auth === false ? undefined : bearer.get();
  if (token) headers.authorization = `Bearer ${token}`;
  let res: Response;
  try {
    res = await fetch(path, {
      method,
      headers,
      credentials: 'same-origin',
      cache: 'no-store',
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
      ...(options.signal ? { signal: options.signal } : {}),
    });
  } catch (e) {
    if (e instanceof DOMException && e.name === 'AbortError') throw e;
    throw new ApiError(unreachable(e));
  }
  const text = await res.text();
  if (!res.ok) {
    const failure = failureFrom(res.status, res.statusText, text);
    const reason = options.auth === false ? undefined : signInReason(failure);
    if (reason) {
      bearer.clear();
      onSignedOut(reason);
    }
    throw new ApiError(failure);
  }
  try {
    return (text ? JSON.parse(text) : {}) as T;
  } catch {
    throw new ApiError({ status: res.status, code: '', message: `the answer of ${method} ${path} is not JSON`, hint: 'Something between the browser and the Proxy changed the answer; reload the page.' });
  }
}

export const api = {
  ping: () => call<Ping>('GET', '/webapi/ping', undefined, { auth: false }),
  connectors: () => call<{ connectors: Connector[]; default?: string }>('GET', '/webapi/connectors', undefined, { auth: false }),
  signIn: (user: string, password: string) => call<SessionCreated>('POST', '/webapi/sessions', { user, password }, { auth: false }),
  /** After an SSO callback: the session's bearer, handed out once for the cookie the callback set. */
  ssoBearer: () => call<SessionCreated>('POST', '/webapi/sessions/bearer', {}, { auth: false }),
  current: () => call<CurrentSession>('GET', '/webapi/sessions/current'),
  signOut: () => call<unknown>('DELETE', '/webapi/sessions'),
  resources: () => call<Resources>('GET', '/webapi/resources'),
  agents: () => call<Agents>('GET', '/webapi/agents'),
  /** The managed rollout (managed: false when there is none: the channels apply). */
  rollout: () => call<RolloutStatus>('GET', '/webapi/autoupdate/status'),
  /** A launch URL for app at addr, its token bound to state (the nonce the app's host set in this browser). */
  launchApp: (name: string, state: string, addr: string) => call<{ url: string }>('POST', `/webapi/apps/${encodeURIComponent(name)}/launch`, { state, addr }),
  maintenance: () => call<{ resources: unknown[] }>('GET', '/v1/resources/cluster_maintenance_config'),
  saveManifest: (manifest: string) => call<{ messages: string[] }>('POST', '/v1/resources', { manifest, overwrite: true, source: 'web' }),
  tokens: () => call<{ tokens: TokenRow[] }>('GET', '/v1/tokens'),
  createToken: (roles: string[], ttlMs: number, uses: number) => call<TokenCreated>('POST', '/v1/tokens', { roles, ttl_ms: ttlMs, uses }),
  revokeToken: (id: string) => call<{ removed: boolean }>('DELETE', `/v1/tokens/${encodeURIComponent(id)}`),
  events: (limit: number) => call<{ events: AuditRow[] }>('GET', `/v1/events?limit=${limit}`),
};

