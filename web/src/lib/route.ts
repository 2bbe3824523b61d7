/** The page's routes under /web/: pure matching, so that it is tested without a browser. */

export type Page = 'login' | 'sso-complete' | 'launch' | 'resources' | 'agents' | 'terminal' | 'maintenance' | 'tokens' | 'audit' | 'not-found';

export interface Route {
  page: Page;
  params: Record<string, string>;
}

export const BASE = '/web';

const STATIC: Record<string, Page> = {
  '': 'resources',
  login: 'login',
  'sso-complete': 'sso-complete',
  launch: 'launch',
  resources: 'resources',
  agents: 'agents',
  maintenance: 'maintenance',
  tokens: 'tokens',
  audit: 'audit',
};

function decode(segment: string): string | undefined {
  try {
    return decodeURIComponent(segment);
  } catch {
    return undefined;
  }
}

/** The page for a path (the query string is not part of it). */
export function matchRoute(pathname: string): Route {
  if (pathname === '/' || pathname === BASE) return { page: 'resources', params: {} };
  if (!pathname.startsWith(`${BASE}/`)) return { page: 'not-found', params: {} };
  const rest = pathname.slice(BASE.length + 1).replace(/\/+$/, '');
  const page = STATIC[rest];
  if (page) return { page, params: {} };
  const m = /^terminal\/([^/]+)$/.exec(rest);
  const node = m ? decode(m[1]!) : undefined;
  if (node) return { page: 'terminal', params: { node } };
  return { page: 'not-found', params: {} };
}

/** The href of a page. */
export function hrefOf(page: Exclude<Page, 'not-found'>, params: Record<string, string> = {}): string {
  if (page === 'terminal') return `${BASE}/terminal/${encodeURIComponent(params.node ?? '')}`;
  return page === 'resources' ? `${BASE}/` : `${BASE}/${page}`;
}

/** The start of an app launch: its own host's /x-gateway-auth, which sets the nonce and sends the page back here. */
export function appLaunchStart(publicAddr: string, port: string, app: string, web: string): string {
  const q = new URLSearchParams({ app, web });
  return `https://${publicAddr}${port && port !== '443' ? `:${port}` : ''}/x-gateway-auth?${q.toString()}`;
}

/**
 * The launch page's query (from the app host's redirect): app, addr (the app's host, host[:port]) and state (its
 * nonce); undefined when any is missing or malformed.
 */
export function launchParams(search: string): { app: string; addr: string; state: string } | undefined {
  const q = new URLSearchParams(search);
  const app = q.get('app') ?? '';
  const addr = q.get('addr') ?? '';
  const state = q.get('state') ?? '';
  if (!/^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/.test(app) || !/^[A-Za-z0-9.-]{1,253}(:\d{1,5})?$/.test(addr) || !/^[A-Za-z0-9_-]{43}$/.test(state)) return undefined;
  return { app, addr: addr.toLowerCase(), state };
}

/** Whether a launch URL the Proxy answered goes where the launch started: https, that host, its /x-gateway-auth. */
export function launchUrlFits(url: string, addr: string): boolean {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return false;
  }
  return u.protocol === 'https:' && u.host.toLowerCase() === addr.toLowerCase().replace(/:443$/, '') && u.pathname === '/x-gateway-auth';
}

/**
 * Where to go after signing in: only a path of this page (never another origin, never a protocol-relative
 * //host, never a backslash trick), else the resources page.
 */
export function safeRedirect(target: string | null | undefined): string {
  if (!target || target.length > 2048) return `${BASE}/`;
  if (!target.startsWith(`${BASE}/`) || target.startsWith('//') || /[\\\u0000-\u001f]/.test(target)) return `${BASE}/`;
  if (target.startsWith(`${BASE}/login`) || target.startsWith(`${BASE}/sso-complete`)) return `${BASE}/`;
  return target;
}
