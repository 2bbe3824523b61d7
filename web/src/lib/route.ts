/** The page's routes under /web/: pure matching, so that it is tested without a browser. */

export type Page = 'login' | 'sso-complete' | 'resources' | 'agents' | 'terminal' | 'maintenance' | 'tokens' | 'audit' | 'not-found';

export interface Route {
  page: Page;
  params: Record<string, string>;
}

export const BASE = '/web';

const STATIC: Record<string, Page> = {
  '': 'resources',
  login: 'login',
  'sso-complete': 'sso-complete',
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
